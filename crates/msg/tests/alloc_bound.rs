//! A frame whose header announces more than `max_message_bytes` is refused
//! before any buffer is allocated for it, and so is a frame whose length an
//! on-path attacker changed (the header MAC fails before the payload is
//! read): measured with a counting global allocator (this test binary
//! only). The two tests run one after the other (`SERIAL`) so that one's
//! big buffers do not count in the other's measurement.

mod common;
use cairn_msg::{connect, MsgConfig, MsgError};
use common::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn oversize_frame_is_refused_without_allocating_it() {
    let _serial = SERIAL.lock().await;
    let server_cfg = MsgConfig {
        max_message_bytes: 1 << 20,
        ..fast_cfg()
    };
    let (l, creds) = admin_listener(server_cfg).await;
    let client = connect(l.local_addr(), &creds, None, &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    let big = payload(96 << 20, 1); // allocated here, before the measurement
    LARGEST.store(0, Ordering::Relaxed);
    let _ = client.send(1, big).await;
    let err = server
        .recv_timeout(Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(err, MsgError::TooLarge { .. }), "{err}");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest < 8 << 20,
        "largest allocation while refusing a 96 MiB frame was {largest} bytes"
    );
}

/// An attacker on the path rewrites a header's payload length to 100 MiB
/// (within `max_message_bytes`): the receiver refuses the header on its
/// MAC, says so naming the peer, closes the connection and allocates
/// nothing for the claimed payload.
#[tokio::test]
async fn forged_length_is_refused_before_allocation() {
    let _serial = SERIAL.lock().await;
    let (l, creds) = admin_listener(fast_cfg()).await;
    let (paddr, _proxy) = proxy(l.local_addr(), Mangle::ForgeLength(1)).await;
    let client = connect(paddr, &creds, Some(&mon_a()), &fast_cfg())
        .await
        .unwrap();
    let server = l.accept().await.unwrap();
    client.send(1, payload(64, 1)).await.unwrap();
    let first = server.recv_timeout(Duration::from_secs(10)).await.unwrap();
    assert_eq!(first.payload, payload(64, 1));
    LARGEST.store(0, Ordering::Relaxed);
    let _ = client.send(2, payload(64, 2)).await;
    let err = server
        .recv_timeout(Duration::from_secs(10))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, MsgError::Integrity { .. }), "{text}");
    assert!(
        text.contains("client.admin") && text.contains("header") && text.contains("not read"),
        "{text}"
    );
    assert!(server.is_closed());
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest < 1 << 20,
        "largest allocation while refusing a forged {FORGED_LEN}-byte length was {largest} bytes"
    );
}
