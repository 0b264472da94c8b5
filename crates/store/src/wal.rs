//! The store's write-ahead log (WAL): one checksummed record per commit group
//! in a preallocated file, written with O_DIRECT and made durable with one
//! fdatasync. Owns the record format, the redo log a group fills while it
//! applies (metadata key/value changes + small-write block images), appending,
//! scanning/decoding for replay, and the pool that recycles the buffers of
//! records and redo logs. It knows nothing about redb: the
//! committer in `store.rs` decides when to append, apply and checkpoint.
//!
//! Record layout (little endian), padded with zeros to a multiple of 4 KiB:
//!
//! ```text
//! header (48 B): magic "CWAL" | version u8 | 3 B zero | seq u64 | store id 16 B
//!                | payload_len u32 | payload crc32c u32 | header crc32c u32 (of bytes 0..40) | 4 B zero
//! payload:       kv_count u32 | kv_len u64 | kv entries
//!                | image_count u32 | image_len u64 | images
//!                | run_count u32 | runs (start u64, blocks u64)
//! kv entry:      table u8 | op u8 (1 put, 0 delete) | key_len u32 | key | [value_len u32 | value]
//! image:         physical block u64 | len u32 | bytes
//! ```
//!
//! The log is circular. Records follow each other back to back from the
//! *head* (the first record not yet checkpointed, whose offset the metadata
//! records as `wal_head`); a record that would not fit before the end of the
//! file goes to offset 0 instead. Sequence numbers grow by one per record
//! and a scan accepts only the next one, so it stops at the first record
//! that is torn, fails its checksum, or is a leftover of an earlier lap.
//! Each open of the store starts its records more sequence numbers on than
//! the log can hold records, so a whole leftover of a crashed run (written
//! after a record that tore) can never pass for the next record either.
//! Where the expected record is not at the current offset the scan looks at
//! offset 0 once (the writer wrapped there) before it stops.

use crate::device::StoreFile;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io;
use std::rc::Rc;
use std::sync::Mutex;

/// WAL records are padded to (and O_DIRECT-written in) multiples of this.
pub(crate) const WAL_ALIGN: u64 = 4096;
const WAL_MAGIC: &[u8; 4] = b"CWAL";
const WAL_RECORD_V1: u8 = 1;
const HEADER_BYTES: usize = 48;
/// Zero-fill chunk when laying out a new WAL file.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// Table ids used in kv entries (stable on disk).
pub(crate) const TABLE_NAMES: [&str; 7] = [
    "super", "colls", "objects", "extents", "omap", "pgmeta", "pglog",
];

/// What one commit group changed, collected while it applies. Once the
/// encoded size passes `limit_bytes` it stops collecting (overflow): the
/// group is then made durable by a direct metadata commit instead of a
/// record, so memory stays bounded whatever the group does.
#[derive(Debug)]
pub(crate) struct RedoLog {
    kv: Vec<u8>,
    kv_count: u32,
    images: Vec<u8>,
    image_count: u32,
    limit_bytes: usize,
    overflow: bool,
}

pub(crate) type SharedRedo = Rc<RefCell<RedoLog>>;

/// Idle buffers of records and redo logs kept for the next groups, at most
/// this many bytes in all (one process-wide pool: every store's committer
/// and WAL threads take from it and give back to it).
const BUF_POOL_IDLE_BYTES: usize = 8 << 20;
/// Idle buffers kept at most.
const BUF_POOL_MAX_BUFFERS: usize = 32;
/// A buffer larger than this is freed rather than kept.
const BUF_POOL_MAX_BUFFER_BYTES: usize = 2 << 20;

/// Recycles the byte buffers every group needs (its redo log's two, its
/// record's, and the one records written together are joined in). A fresh
/// buffer of 100 KiB or more is fresh memory from the allocator, which
/// the kernel faults in and zeroes page by page (with transparent huge
/// pages 2 MiB at a time) — ~9 % of the store process's CPU samples in
/// the 4 KiB write bench before the buffers were kept; a record buffer is
/// also freed on another thread (the WAL thread that wrote it) than the
/// one that allocated it, which keeps the allocator from reusing it soon.
struct BufPool {
    idle: Vec<Vec<u8>>,
    idle_bytes: usize,
}

static BUF_POOL: Mutex<BufPool> = Mutex::new(BufPool {
    idle: Vec::new(),
    idle_bytes: 0,
});

/// An empty buffer with room for at least `min_bytes`: the smallest idle
/// one that is large enough, else the largest idle one grown, else a new one.
fn take_buf(min_bytes: usize) -> Vec<u8> {
    let taken = BUF_POOL.lock().ok().and_then(|mut p| {
        let caps = |i: usize| p.idle[i].capacity();
        let fits = (0..p.idle.len())
            .filter(|&i| caps(i) >= min_bytes)
            .min_by_key(|&i| caps(i));
        let i = fits.or_else(|| (0..p.idle.len()).max_by_key(|&i| caps(i)))?;
        let b = p.idle.swap_remove(i);
        p.idle_bytes -= b.capacity();
        Some(b)
    });
    match taken {
        Some(mut b) => {
            b.clear();
            b.reserve(min_bytes);
            b
        }
        None => Vec::with_capacity(min_bytes),
    }
}

/// Gives a buffer back to the pool (freed when the pool is full or the
/// buffer too large or empty).
fn give_buf(b: Vec<u8>) {
    let cap = b.capacity();
    if cap == 0 || cap > BUF_POOL_MAX_BUFFER_BYTES {
        return;
    }
    if let Ok(mut p) = BUF_POOL.lock() {
        if p.idle.len() < BUF_POOL_MAX_BUFFERS && p.idle_bytes + cap <= BUF_POOL_IDLE_BYTES {
            p.idle_bytes += cap;
            p.idle.push(b);
        }
    }
}

impl Drop for RedoLog {
    fn drop(&mut self) {
        give_buf(std::mem::take(&mut self.kv));
        give_buf(std::mem::take(&mut self.images));
    }
}

impl RedoLog {
    /// A redo log that stops collecting past `limit_bytes` (0: records
    /// nothing); `images_bytes`: about how many bytes of block images the
    /// group will log (room taken up front, so the buffer need not grow).
    pub fn new(limit_bytes: usize, images_bytes: usize) -> SharedRedo {
        let (kv, images) = if limit_bytes == 0 {
            (Vec::new(), Vec::new())
        } else {
            let images = take_buf(images_bytes.min(limit_bytes));
            (take_buf(0), images)
        };
        Rc::new(RefCell::new(RedoLog {
            kv,
            kv_count: 0,
            images,
            image_count: 0,
            limit_bytes,
            overflow: limit_bytes == 0,
        }))
    }
    /// A log that records nothing (replay, checkpoints, mkfs).
    pub fn disabled() -> SharedRedo {
        RedoLog::new(0, 0)
    }
    pub fn overflowed(&self) -> bool {
        self.overflow
    }
    fn room_for(&mut self, n: usize) -> bool {
        if self.overflow {
            return false;
        }
        if self.kv.len() + self.images.len() + n > self.limit_bytes {
            self.overflow = true;
            self.kv = Vec::new();
            self.images = Vec::new();
            return false;
        }
        true
    }
    pub fn put(&mut self, table: u8, key: &[u8], value: &[u8]) {
        if self.room_for(10 + key.len() + value.len()) {
            self.kv.push(table);
            self.kv.push(1);
            self.kv.extend_from_slice(&(key.len() as u32).to_le_bytes());
            self.kv.extend_from_slice(key);
            self.kv
                .extend_from_slice(&(value.len() as u32).to_le_bytes());
            self.kv.extend_from_slice(value);
            self.kv_count += 1;
        }
    }
    pub fn delete(&mut self, table: u8, key: &[u8]) {
        if self.room_for(6 + key.len()) {
            self.kv.push(table);
            self.kv.push(0);
            self.kv.extend_from_slice(&(key.len() as u32).to_le_bytes());
            self.kv.extend_from_slice(key);
            self.kv_count += 1;
        }
    }
    /// `data` was written (buffered, not synced) at physical block `pblock`.
    pub fn image(&mut self, pblock: u64, data: &[u8]) {
        if self.room_for(12 + data.len()) {
            self.images.extend_from_slice(&pblock.to_le_bytes());
            self.images
                .extend_from_slice(&(data.len() as u32).to_le_bytes());
            self.images.extend_from_slice(data);
            self.image_count += 1;
        }
    }
}

/// Encodes one record (padded to [`WAL_ALIGN`]); `runs` are the block runs
/// the group's large writes put in place (synced before this record).
/// One encoded record, in a buffer whose first byte is 4 KiB-aligned in
/// memory, so an O_DIRECT write takes it as it is (no bounce copy).
pub(crate) struct WalRecord {
    buf: Vec<u8>,
    start: usize,
}

impl WalRecord {
    /// An empty record buffer with room for `total` bytes after the aligned start.
    fn with_capacity(total: usize) -> WalRecord {
        let align = WAL_ALIGN as usize;
        let mut buf = take_buf(total + align);
        let start = buf.as_ptr().align_offset(align).min(align);
        buf.resize(start, 0);
        WalRecord { buf, start }
    }
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }
    fn body_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..]
    }
    /// Records that follow each other in the log, in one aligned buffer
    /// (one O_DIRECT write for all of them).
    pub fn concat(parts: &[&WalRecord]) -> WalRecord {
        let mut r = WalRecord::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            r.push(p);
        }
        r
    }
}

impl Drop for WalRecord {
    fn drop(&mut self) {
        give_buf(std::mem::take(&mut self.buf));
    }
}

impl std::ops::Deref for WalRecord {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

pub(crate) fn encode_record(
    seq: u64,
    store_id: &[u8; 16],
    redo: &RedoLog,
    runs: &[(u64, u64)],
) -> WalRecord {
    debug_assert!(!redo.overflow);
    let payload_len = 4 + 8 + redo.kv.len() + 4 + 8 + redo.images.len() + 4 + 16 * runs.len();
    let total = (HEADER_BYTES + payload_len).next_multiple_of(WAL_ALIGN as usize);
    let mut v = WalRecord::with_capacity(total);
    v.push(&[0u8; HEADER_BYTES]);
    v.push(&redo.kv_count.to_le_bytes());
    v.push(&(redo.kv.len() as u64).to_le_bytes());
    v.push(&redo.kv);
    v.push(&redo.image_count.to_le_bytes());
    v.push(&(redo.images.len() as u64).to_le_bytes());
    v.push(&redo.images);
    v.push(&(runs.len() as u32).to_le_bytes());
    for &(s, l) in runs {
        v.push(&s.to_le_bytes());
        v.push(&l.to_le_bytes());
    }
    let h = v.body_mut();
    let pcrc = crc32c::crc32c(&h[HEADER_BYTES..]);
    h[0..4].copy_from_slice(WAL_MAGIC);
    h[4] = WAL_RECORD_V1;
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..32].copy_from_slice(store_id);
    h[32..36].copy_from_slice(&(payload_len as u32).to_le_bytes());
    h[36..40].copy_from_slice(&pcrc.to_le_bytes());
    let hcrc = crc32c::crc32c(&h[..40]);
    h[40..44].copy_from_slice(&hcrc.to_le_bytes());
    let pad = total - (HEADER_BYTES + payload_len);
    v.buf.resize(v.buf.len() + pad, 0);
    v
}

/// The append side of the log, owned by the committer thread. Positions are
/// logical (ever-growing) byte offsets; the file offset is `pos % capacity`.
pub(crate) struct WalWriter {
    capacity_bytes: u64,
    /// Logical position of the first live (not yet checkpointed) record.
    head: u64,
    /// Logical position where the next record goes (or where it wraps from).
    tail: u64,
    /// Sequence number of the next record.
    next_seq: u64,
    store_id: [u8; 16],
}

impl WalWriter {
    /// An empty log whose next record is `next_seq`, written at file offset `at`.
    pub fn new(capacity_bytes: u64, at: u64, next_seq: u64, store_id: [u8; 16]) -> WalWriter {
        debug_assert_eq!(capacity_bytes % WAL_ALIGN, 0);
        WalWriter {
            capacity_bytes,
            head: at,
            tail: at,
            next_seq,
            store_id,
        }
    }
    pub fn store_id(&self) -> &[u8; 16] {
        &self.store_id
    }
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// Sequence number of the last record appended.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
    /// Bytes between head and tail (records not yet checkpointed, plus any
    /// gap left at the end of the file by a wrap).
    pub fn used_bytes(&self) -> u64 {
        self.tail - self.head
    }
    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }
    /// Logical position of the tail (a checkpoint of everything appended so
    /// far moves the head here).
    pub fn tail_pos(&self) -> u64 {
        self.tail
    }
    /// File offset of a logical position.
    pub fn file_offset(&self, pos: u64) -> u64 {
        pos % self.capacity_bytes
    }
    /// Logical start of a record of `len` bytes appended now, if it fits.
    fn place(&self, len: u64) -> Option<u64> {
        let cap = self.capacity_bytes;
        let mut at = self.tail;
        if at % cap + len > cap {
            at = at.next_multiple_of(cap);
        }
        (at + len - self.head <= cap).then_some(at)
    }
    /// True if a record of `len` bytes can be appended now.
    pub fn fits(&self, len: u64) -> bool {
        self.place(len).is_some()
    }
    /// Reserves room for the next record (`len` bytes, from [`encode_record`]
    /// with `next_seq`) and returns its file offset; the caller writes it there
    /// (see [`write_record`]). None if it does not fit.
    pub fn reserve(&mut self, len: u64) -> Option<u64> {
        debug_assert_eq!(len % WAL_ALIGN, 0);
        let at = self.place(len)?;
        self.tail = at + len;
        self.next_seq += 1;
        Some(at % self.capacity_bytes)
    }
    /// Reserves and writes `record` and makes it durable (tests; the store
    /// pipelines [`WalWriter::reserve`] and [`write_record`] instead).
    #[cfg(test)]
    pub fn append(&mut self, file: &dyn StoreFile, record: &[u8]) -> io::Result<()> {
        let at = self
            .reserve(record.len() as u64)
            .ok_or_else(|| io::Error::other("WAL record does not fit"))?;
        write_record(file, at, record)?;
        file.sync_data()
    }
    /// A checkpoint made every record before logical position `pos` durable
    /// in the metadata: their space is free again.
    pub fn advance_head(&mut self, pos: u64) {
        debug_assert!(pos >= self.head && pos <= self.tail);
        self.head = pos.clamp(self.head, self.tail);
    }
}

/// Writes one record at its reserved offset (not yet durable: the caller
/// syncs once for all the records it wrote). On error the log must not be
/// used again (the store poisons itself): the file may hold a torn record.
pub(crate) fn write_record(file: &dyn StoreFile, offset: u64, record: &[u8]) -> io::Result<()> {
    file.write_at_direct(record, offset)
}

/// Lays out a new WAL file: `bytes` reserved and written with zeros (so
/// appends never convert unwritten extents), then synced.
pub(crate) fn format(file: &dyn StoreFile, bytes: u64) -> io::Result<()> {
    file.set_len(0)?;
    file.preallocate(bytes)?;
    let zeros = vec![0u8; FILL_CHUNK_BYTES];
    let mut off = 0u64;
    while off < bytes {
        let n = (bytes - off).min(FILL_CHUNK_BYTES as u64) as usize;
        file.write_at(&zeros[..n], off)?;
        off += n as u64;
    }
    file.sync_data()
}

/// Where one valid record lies in the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordPos {
    pub offset: u64,
    pub seq: u64,
    pub payload_len: u32,
}

/// Finds the valid records of the log, starting at file offset `start` with
/// sequence `first_seq`; stops at the first torn, corrupt or stale record
/// (after looking once at offset 0, where the writer wraps to).
pub(crate) fn scan(
    file: &dyn StoreFile,
    capacity_bytes: u64,
    store_id: &[u8; 16],
    start: u64,
    first_seq: u64,
) -> io::Result<Vec<RecordPos>> {
    let mut out = Vec::new();
    let mut off = start;
    // Each record is at least one block: more steps than blocks means a loop.
    let max_steps = capacity_bytes / WAL_ALIGN + 1;
    for seq in first_seq..first_seq + max_steps {
        let found = match read_record_at(file, capacity_bytes, store_id, off, seq)? {
            Some(pos) => Some(pos),
            None if off != 0 => read_record_at(file, capacity_bytes, store_id, 0, seq)?,
            None => None,
        };
        let Some(pos) = found else {
            break;
        };
        off = (pos.offset + pos.padded_len()) % capacity_bytes;
        out.push(pos);
    }
    Ok(out)
}

impl RecordPos {
    /// Bytes the record takes in the file (header + payload, padded).
    pub fn padded_len(&self) -> u64 {
        (HEADER_BYTES as u64 + self.payload_len as u64).next_multiple_of(WAL_ALIGN)
    }
}

/// The record at `off` if it is whole, checksummed and carries `seq`.
fn read_record_at(
    file: &dyn StoreFile,
    capacity_bytes: u64,
    store_id: &[u8; 16],
    off: u64,
    seq: u64,
) -> io::Result<Option<RecordPos>> {
    if off + WAL_ALIGN > capacity_bytes {
        return Ok(None);
    }
    let mut head = vec![0u8; HEADER_BYTES];
    file.read_at(&mut head, off)?;
    let Some(payload_len) = parse_header(&head, seq, store_id) else {
        return Ok(None);
    };
    let pos = RecordPos {
        offset: off,
        seq,
        payload_len,
    };
    if off + pos.padded_len() > capacity_bytes {
        return Ok(None);
    }
    let want = u32::from_le_bytes([head[36], head[37], head[38], head[39]]);
    let payload = read_payload(file, &pos)?;
    Ok((crc32c::crc32c(&payload) == want).then_some(pos))
}

fn parse_header(h: &[u8], seq: u64, store_id: &[u8; 16]) -> Option<u32> {
    if &h[0..4] != WAL_MAGIC || h[4] != WAL_RECORD_V1 {
        return None;
    }
    let hcrc = u32::from_le_bytes([h[40], h[41], h[42], h[43]]);
    if crc32c::crc32c(&h[..40]) != hcrc {
        return None;
    }
    let rseq = u64::from_le_bytes(h[8..16].try_into().ok()?);
    if rseq != seq || &h[16..32] != store_id {
        return None;
    }
    Some(u32::from_le_bytes([h[32], h[33], h[34], h[35]]))
}

/// Reads the payload of a record found by [`scan`].
pub(crate) fn read_payload(file: &dyn StoreFile, pos: &RecordPos) -> io::Result<Vec<u8>> {
    let mut payload = vec![0u8; pos.payload_len as usize];
    file.read_at(&mut payload, pos.offset + HEADER_BYTES as u64)?;
    Ok(payload)
}

/// One metadata change of a record.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KvChange<'a> {
    Put(u8, &'a [u8], &'a [u8]),
    Delete(u8, &'a [u8]),
}

/// A decoded record payload (borrowing the payload bytes).
#[derive(Debug, Default)]
pub(crate) struct RecordView<'a> {
    pub kv: Vec<KvChange<'a>>,
    pub images: Vec<(u64, &'a [u8])>,
    pub runs: Vec<(u64, u64)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| format!("WAL record truncated at byte {}", self.at))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// Decodes a payload whose checksum already matched; an error here means a
/// record that was written wrong (a bug), reported as corruption.
pub(crate) fn decode_payload(p: &[u8]) -> Result<RecordView<'_>, String> {
    let mut c = Cursor { b: p, at: 0 };
    let mut v = RecordView::default();
    let kv_count = c.u32()?;
    let _kv_len = c.u64()?;
    for _ in 0..kv_count {
        let table = c.u8()?;
        if table as usize >= TABLE_NAMES.len() {
            return Err(format!("WAL record names unknown table {table}"));
        }
        let op = c.u8()?;
        let klen = c.u32()? as usize;
        let key = c.take(klen)?;
        match op {
            1 => {
                let vlen = c.u32()? as usize;
                v.kv.push(KvChange::Put(table, key, c.take(vlen)?));
            }
            0 => v.kv.push(KvChange::Delete(table, key)),
            _ => return Err(format!("WAL record has unknown kv op {op}")),
        }
    }
    let image_count = c.u32()?;
    let _image_len = c.u64()?;
    for _ in 0..image_count {
        let pblock = c.u64()?;
        let len = c.u32()? as usize;
        v.images.push((pblock, c.take(len)?));
    }
    let run_count = c.u32()?;
    for _ in 0..run_count {
        let s = c.u64()?;
        let l = c.u64()?;
        v.runs.push((s, l));
    }
    if c.at != p.len() {
        return Err(format!("WAL record has {} trailing bytes", p.len() - c.at));
    }
    Ok(v)
}

/// Blocks already claimed by a later writer during replay (an interval set
/// that tolerates overlapping inserts).
#[derive(Debug, Default)]
pub(crate) struct BlockSet {
    /// start -> end (exclusive), non-overlapping, coalesced.
    runs: BTreeMap<u64, u64>,
}

impl BlockSet {
    pub fn contains(&self, b: u64) -> bool {
        self.runs
            .range(..=b)
            .next_back()
            .is_some_and(|(_, &e)| b < e)
    }
    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut s = start;
        let mut e = start + len;
        if let Some((&ps, &pe)) = self.runs.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.runs.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.runs.range(s..=e).next() {
            e = e.max(ne);
            self.runs.remove(&ns);
        }
        self.runs.insert(s, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{FaultPlan, SimFile};

    fn sample(seq: u64) -> WalRecord {
        let r = RedoLog::new(1 << 20, 0);
        {
            let mut r = r.borrow_mut();
            r.put(2, b"key", b"value");
            r.delete(4, b"gone");
            r.image(77, &[seq as u8; 4096]);
        }
        let r = r.borrow();
        encode_record(seq, &[7; 16], &r, &[(100, 3)])
    }

    #[test]
    fn record_round_trip() {
        let rec = sample(5);
        assert_eq!(rec.len() % WAL_ALIGN as usize, 0);
        let f = SimFile::new(FaultPlan::new());
        format(&*f, 64 << 10).unwrap();
        f.write_at(&rec, 0).unwrap();
        let found = scan(&*f, 64 << 10, &[7; 16], 0, 5).unwrap();
        assert_eq!(found.len(), 1);
        let p = read_payload(&*f, &found[0]).unwrap();
        let v = decode_payload(&p).unwrap();
        assert_eq!(v.kv[0], KvChange::Put(2, b"key", b"value"));
        assert_eq!(v.kv[1], KvChange::Delete(4, b"gone"));
        assert_eq!(v.images[0].0, 77);
        assert_eq!(v.runs, vec![(100, 3)]);
    }

    #[test]
    fn records_are_aligned_in_memory_and_concatenate() {
        let (a, b) = (sample(1), sample(2));
        for r in [&a, &b] {
            assert_eq!(r.as_ptr() as usize % WAL_ALIGN as usize, 0);
        }
        let both = WalRecord::concat(&[&a, &b]);
        assert_eq!(both.as_ptr() as usize % WAL_ALIGN as usize, 0);
        assert_eq!(&both[..a.len()], &a[..]);
        assert_eq!(&both[a.len()..], &b[..]);
        let f = SimFile::new(FaultPlan::new());
        format(&*f, 64 << 10).unwrap();
        f.write_at(&both, 0).unwrap();
        assert_eq!(scan(&*f, 64 << 10, &[7; 16], 0, 1).unwrap().len(), 2);
    }

    #[test]
    fn recycled_buffers_give_aligned_clean_records_and_the_pool_stays_bounded() {
        // Records built from buffers earlier records and redo logs gave
        // back (other tests share the pool) are aligned and byte-identical
        // to a first one: a reused buffer carries nothing of its last use.
        let first = sample(9).to_vec();
        for round in 0..40 {
            let big = RedoLog::new(4 << 20, 300 << 10);
            big.borrow_mut().image(1, &vec![round as u8; 256 << 10]);
            drop(encode_record(round, &[7; 16], &big.borrow(), &[]));
            let r = sample(9);
            assert_eq!(r.as_ptr() as usize % WAL_ALIGN as usize, 0);
            assert_eq!(&r[..], &first[..]);
            let joined = WalRecord::concat(&[&r, &r]);
            assert_eq!(joined.as_ptr() as usize % WAL_ALIGN as usize, 0);
            assert_eq!(&joined[r.len()..], &first[..]);
        }
        // Too large to keep, and more than the pool holds: the bounds hold.
        give_buf(Vec::with_capacity(BUF_POOL_MAX_BUFFER_BYTES + 1));
        for _ in 0..2 * BUF_POOL_MAX_BUFFERS {
            give_buf(Vec::with_capacity(1 << 20));
        }
        let p = BUF_POOL.lock().unwrap();
        assert!(p.idle.len() <= BUF_POOL_MAX_BUFFERS);
        assert!(p.idle_bytes <= BUF_POOL_IDLE_BYTES);
        assert_eq!(
            p.idle_bytes,
            p.idle.iter().map(|b| b.capacity()).sum::<usize>()
        );
        assert!(p
            .idle
            .iter()
            .all(|b| b.capacity() <= BUF_POOL_MAX_BUFFER_BYTES));
    }

    #[test]
    fn scan_stops_at_torn_stale_or_foreign_records() {
        let f = SimFile::new(FaultPlan::new());
        let cap = 64 << 10;
        format(&*f, cap).unwrap();
        let (a, b) = (sample(1), sample(2));
        f.write_at(&a, 0).unwrap();
        f.write_at(&b, a.len() as u64).unwrap();
        assert_eq!(scan(&*f, cap, &[7; 16], 0, 1).unwrap().len(), 2);
        // Wrong expected sequence (a stale record of an earlier lap): nothing.
        assert_eq!(scan(&*f, cap, &[7; 16], 0, 2).unwrap().len(), 0);
        // Another store's log: nothing.
        assert_eq!(scan(&*f, cap, &[8; 16], 0, 1).unwrap().len(), 0);
        // A flipped payload byte in the second record: only the first survives.
        f.corrupt(a.len() as u64 + 100, 1).unwrap();
        assert_eq!(scan(&*f, cap, &[7; 16], 0, 1).unwrap().len(), 1);
    }

    #[test]
    fn writer_wraps_and_scan_follows() {
        let f = SimFile::new(FaultPlan::new());
        let cap = 44 << 10;
        format(&*f, cap).unwrap();
        let mut w = WalWriter::new(cap, 0, 1, [7; 16]);
        let rec = |w: &WalWriter| sample(w.next_seq()); // 8 KiB each
        for _ in 0..5 {
            let r = rec(&w);
            w.append(&*f, &r).unwrap();
        }
        // 40 KiB used: a sixth record does not fit until the head moves.
        assert!(!w.fits(8 << 10));
        let head3 = 16 << 10; // records 3.. start here
        w.advance_head(head3);
        let r = rec(&w);
        w.append(&*f, &r).unwrap(); // seq 6 skips the 4 KiB at the end: offset 0
        let r = rec(&w);
        w.append(&*f, &r).unwrap(); // seq 7 at 8 KiB
        assert_eq!(w.file_offset(w.tail_pos()), 16 << 10);
        assert!(!w.fits(4 << 10)); // the head (record 3) is right there
        let found = scan(&*f, cap, &[7; 16], head3, 3).unwrap();
        let seqs: Vec<u64> = found.iter().map(|p| p.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5, 6, 7]);
        assert_eq!(found.last().map(|p| p.offset), Some(8 << 10));
    }

    #[test]
    fn overflow_drops_everything_and_stays_overflowed() {
        let r = RedoLog::new(100, 0);
        let mut r = r.borrow_mut();
        r.put(1, b"a", b"b");
        assert!(!r.overflowed());
        r.image(1, &[0; 4096]);
        assert!(r.overflowed());
        r.put(1, b"a", b"b");
        assert!(r.overflowed() && r.kv.is_empty() && r.images.is_empty());
    }

    #[test]
    fn block_set_merges_overlaps() {
        let mut s = BlockSet::default();
        s.insert(10, 5);
        s.insert(12, 10);
        s.insert(30, 1);
        s.insert(0, 11);
        assert!(s.contains(0) && s.contains(21) && s.contains(30));
        assert!(!s.contains(22) && !s.contains(31));
        assert_eq!(s.runs.len(), 2);
    }
}
