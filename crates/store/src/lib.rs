//! cairn-store (being written).
