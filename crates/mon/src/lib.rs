//! cairn-mon (being written).
