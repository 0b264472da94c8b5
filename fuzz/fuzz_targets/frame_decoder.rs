//! Feeds arbitrary bytes to the cairn-msg frame/handshake decoder, both raw
//! and as an overlay on valid sample frames (so the fuzzer gets past the
//! magic and the MAC quickly). Any panic or abort is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static SAMPLES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    cairn_msg::fuzz_decode(data);
    let samples = SAMPLES.get_or_init(cairn_msg::fuzz_samples);
    if let Some((&pick, rest)) = data.split_first() {
        let mut frame = samples[pick as usize % samples.len()].clone();
        // First two bytes of `rest`: where to cut; the rest is XORed in.
        let (cut, overlay) = match rest {
            [a, b, tail @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), tail),
            _ => (usize::MAX, rest),
        };
        for (i, x) in overlay.iter().enumerate() {
            if let Some(b) = frame.get_mut(i) {
                *b ^= x;
            }
        }
        frame.truncate(cut);
        cairn_msg::fuzz_decode(&frame);
    }
});
