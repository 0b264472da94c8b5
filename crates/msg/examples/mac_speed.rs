//! How fast one core computes the frame MAC (keyed BLAKE3, `FrameKey`)
//! over a big payload, depending on how the payload is split into
//! segments (`sign_parts`), beside a plain memory copy of the same bytes
//! (the cost of one more copy per byte). Run with:
//!     cargo run --release -p cairn-msg --example mac_speed -- [MIB] [ROUNDS]
//! Prints GB/s per layout (best of ROUNDS, default 5, over MIB MiB, default
//! 256), and the BLAKE3 SIMD level this CPU gets.

use bytes::Bytes;
use cairn_msg::auth::FrameKey;
use cairn_msg::Secret;
use std::hint::black_box;
use std::time::Instant;

fn best_gbps(bytes: usize, rounds: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let key = FrameKey::new(&Secret::from_bytes([3; 32]));
    let header = [7u8; cairn_msg::frame::SIGNED_HEADER_LEN];
    let frame = 1usize << 20;
    let frames = mib.max(1);
    let total = frames * frame;
    let data: Vec<u8> = (0..frame).map(|i| (i * 31 % 251) as u8).collect();
    let whole = Bytes::from(data.clone());
    println!(
        "payload {} MiB in {frames} frames of 1 MiB, best of {rounds}",
        total >> 20
    );
    let r = best_gbps(total, rounds, || {
        for _ in 0..frames {
            black_box(key.sign(&header, black_box(&whole)));
        }
    });
    println!("keyed BLAKE3, one 1 MiB segment per frame:  {r:6.2} GB/s");
    for seg in [256 << 10, 64 << 10, 16 << 10, 4 << 10, 1 << 10] {
        let parts: Vec<Bytes> = (0..frame / seg)
            .map(|i| whole.slice(i * seg..(i + 1) * seg))
            .collect();
        let r = best_gbps(total, rounds, || {
            for _ in 0..frames {
                black_box(key.sign_parts(&header, black_box(&parts)));
            }
        });
        println!(
            "keyed BLAKE3, {:>4} KiB segments:            {r:6.2} GB/s",
            seg >> 10
        );
    }
    // A small envelope segment in front of the data (what encode_parts
    // produces: postcard framing, then the shared data field).
    let parts = vec![Bytes::from(vec![1u8; 37]), whole.clone()];
    let r = best_gbps(total, rounds, || {
        for _ in 0..frames {
            black_box(key.sign_parts(&header, black_box(&parts)));
        }
    });
    println!("keyed BLAKE3, 37-byte envelope + 1 MiB data: {r:6.2} GB/s");
    let mut dst = vec![0u8; frame];
    let r = best_gbps(total, rounds, || {
        for _ in 0..frames {
            dst.copy_from_slice(black_box(&data));
            black_box(&dst);
        }
    });
    println!("memcpy of the same bytes (one copy):         {r:6.2} GB/s");
    let r = best_gbps(total, rounds, || {
        for _ in 0..frames {
            black_box(blake3::hash(black_box(&data)));
        }
    });
    println!("unkeyed blake3::hash, 1 MiB:                 {r:6.2} GB/s");
}
