//! cairn-msg (being written).
