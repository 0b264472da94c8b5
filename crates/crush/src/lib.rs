//! cairn-crush (being written).
