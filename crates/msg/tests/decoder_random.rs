//! Bounded random-bytes and mutated-frame test of the decoder (the CI
//! stand-in for the cargo-fuzz target): garbage must yield an error, never a
//! panic, and valid streams must decode fully.

use cairn_msg::frame::{FrameHeader, FrameKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Instant;

fn valid_stream(rng: &mut StdRng) -> (Vec<u8>, usize) {
    let mut signer = cairn_msg::fuzz_signer();
    let mut out = Vec::new();
    let n = rng.gen_range(1..5);
    for i in 0..n {
        let len = rng.gen_range(0..200);
        let mut payload = vec![0u8; len];
        rng.fill(&mut payload[..]);
        let kind = if rng.gen_bool(0.2) {
            FrameKind::Keepalive
        } else {
            FrameKind::Message
        };
        let payload = if kind == FrameKind::Keepalive {
            Vec::new()
        } else {
            payload
        };
        let mut h = FrameHeader::new(kind, rng.gen(), payload.len() as u32);
        h.id = i;
        if rng.gen_bool(0.5) {
            h.reply_to = Some(rng.gen());
        }
        out.extend_from_slice(&signer.seal(&mut h, &payload));
        out.extend_from_slice(&payload);
    }
    (out, n as usize)
}

fn mutate(rng: &mut StdRng, buf: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..4) {
        match rng.gen_range(0..6) {
            0 if !buf.is_empty() => {
                let i = rng.gen_range(0..buf.len());
                buf[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if !buf.is_empty() => {
                let i = rng.gen_range(0..buf.len());
                buf[i] = rng.gen();
            }
            2 => {
                let cut = rng.gen_range(0..=buf.len());
                buf.truncate(cut);
            }
            3 => {
                let i = rng.gen_range(0..=buf.len());
                buf.insert(i, rng.gen());
            }
            4 if buf.len() >= 14 => {
                // Lengths are where decoders go wrong: set a huge one.
                buf[10..14].copy_from_slice(&rng.gen::<u32>().to_le_bytes());
            }
            _ => {
                let i = rng.gen_range(0..=buf.len());
                let j = rng.gen_range(i..=buf.len());
                let dup = buf[i..j].to_vec();
                buf.extend_from_slice(&dup);
            }
        }
    }
}

fn run_slice(seed: u64, count: usize, samples: &[Vec<u8>]) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    // Valid signed streams are costly to build in a debug build: make a
    // pool once and mutate copies.
    let pool: Vec<(Vec<u8>, usize)> = (0..500).map(|_| valid_stream(&mut rng)).collect();
    for (v, n) in &pool {
        assert_eq!(
            cairn_msg::fuzz_decode(v),
            *n,
            "a valid stream must decode fully"
        );
    }
    let mut accepted = 0usize;
    for i in 0..count {
        let input: Vec<u8> = match i % 3 {
            0 => {
                let len = rng.gen_range(0..300);
                let mut v = vec![0u8; len];
                rng.fill(&mut v[..]);
                if rng.gen_bool(0.5) && v.len() >= 6 {
                    v[..5].copy_from_slice(b"CAIR\x01");
                }
                v
            }
            1 => {
                let mut v = pool[rng.gen_range(0..pool.len())].0.clone();
                mutate(&mut rng, &mut v);
                v
            }
            _ => {
                let mut v = samples[rng.gen_range(0..samples.len())].clone();
                mutate(&mut rng, &mut v);
                v
            }
        };
        accepted += cairn_msg::fuzz_decode(&input);
    }
    accepted
}

#[test]
fn random_and_mutated_frames_never_panic() {
    let samples = cairn_msg::fuzz_samples();
    // CAIRN_SOAK=1 runs 100x longer.
    let soak = std::env::var("CAIRN_SOAK").is_ok_and(|v| v == "1");
    let total = if soak { 30_000_000 } else { 300_000 };
    let threads = 2;
    let start = Instant::now();
    let accepted: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let samples = &samples;
                s.spawn(move || run_slice(0xCA1A + t as u64, total / threads, samples))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let took = start.elapsed();
    eprintln!("{total} inputs in {took:?}, {accepted} frames accepted");
    assert!(accepted > 0);
    assert!(
        soak || took.as_secs() < 30,
        "decoder got very slow: {took:?}"
    );
}
