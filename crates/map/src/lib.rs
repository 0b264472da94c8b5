//! cairn-map (being written).
