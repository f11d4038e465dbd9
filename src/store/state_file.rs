//! The memory store's buckets on disk (`store.state_file`), so that a restart does not hand
//! every refused client a full budget.
//!
//! Written once, when the process stops (after its listeners have drained), to a temporary file
//! beside the target that is then renamed over it: a reader sees the old file or the new one,
//! never half of one. Read once, at start. What is written is what the store holds: bucket
//! names (16-byte digests under the store's key, never a raw agent id, token or key), their
//! states as time *left* when the file was written, and the store's digest key, without which
//! the names would mean nothing to the next process (so the file is created readable by its
//! owner only).
//!
//! Reading never trusts the file: a missing file is a first start; a file that is truncated,
//! corrupt (its SHA-256 does not match), of another format or version, larger than the store
//! can hold, or that names a state further ahead than any limiter of the configuration can
//! reach, is reported and ignored as a whole or entry by entry. Time that passed while no
//! process ran is counted from the wall clock: a bucket that has filled again is gone, a
//! refused one is still refused for what is left of its wait. A wall clock that went backwards
//! counts as no time passed, so a file never grants a budget its buckets did not have.
//!
//! The known-agents table (`meter = "new-agents"`) is kept beside the buckets, in the same way:
//! its ids' 64-bit digests and their addresses', never the ids, under its own digest key.
//!
//! Layout (little-endian): `FLSTATE\0`, version `u32`, the buckets' digest key `k0 u64, k1
//! u64`, the wall clock at writing (nanoseconds since the Unix epoch, `u64`), the bucket count
//! `u64`, then per bucket the digest `[u8; 16]`, a tag `u8` (0 GCRA, 1 fixed window, 2 locked),
//! the time left `u64` (nanoseconds) and the fixed window's count `u32`; then the known-agents
//! key `k0 u64, k1 u64`, their count `u64`, and per id its segment `u8` (0 probation, 1
//! protected), its digest `u64`, its address's `u64`, the time since it was last admitted `u64`
//! and the time it stays known `u64`; last, the SHA-256 of all of it.

use crate::clock::Nanos;
use crate::known_agents::Kept;
use crate::limiter::State;
use sha2::{Digest, Sha256};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 8] = b"FLSTATE\0";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 8 + 8 + 8;
const ENTRY: usize = 16 + 1 + 8 + 4;
const KNOWN_HEADER: usize = 8 + 8 + 8;
const KNOWN: usize = 1 + 8 + 8 + 8 + 8;
const CHECKSUM: usize = 32;

/// What a process keeps for the next: its buckets and its known agents, each with the digest
/// key that names them, their times on one clock.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) buckets_key: (u64, u64),
    pub(crate) buckets: Vec<Entry>,
    pub(crate) known_key: (u64, u64),
    pub(crate) known: Vec<Kept>,
}

/// One bucket as the file holds it: its name and its state, with times as what was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub(crate) digest: [u8; 16],
    pub(crate) state: State,
}

/// What reading the file found.
#[derive(Debug)]
pub(crate) enum Read {
    /// No file: nothing to restore.
    Missing,
    /// The file, with its entries' times made this process's (`now`-based).
    Restored(Restored),
    /// A file that cannot be used, and why (the store starts empty, under a new key).
    Ignored(String),
    /// Something at the path that is not a regular file (a symbolic link, a FIFO, a device, a
    /// directory), and what: start-up stops, since writing there at the end would harm it.
    Refused(String),
}

#[derive(Debug)]
pub(crate) struct Restored {
    /// Buckets and known agents, their times this process's.
    pub(crate) snapshot: Snapshot,
    /// Buckets that filled again while no process ran.
    pub(crate) expired: usize,
    /// Entries further ahead than `horizon`, or of an unknown kind: not restored.
    pub(crate) out_of_range: usize,
    /// How much time passed between writing and reading, by the wall clock.
    pub(crate) elapsed: Duration,
}

/// Write `snapshot` (its times on the clock that gives `now`) to `path`, atomically. Returns
/// how many buckets and known agents were written (what has expired is left out).
pub(crate) fn write(path: &Path, now: Nanos, snapshot: &Snapshot) -> io::Result<(usize, usize)> {
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let live: Vec<(&Entry, Nanos)> = snapshot
        .buckets
        .iter()
        .filter_map(|e| {
            let left = e.state.expires_at().saturating_sub(now);
            (left > 0).then_some((e, left))
        })
        .collect();
    let known: Vec<&Kept> = snapshot.known.iter().filter(|k| k.until > now).collect();
    let mut buf = Vec::with_capacity(
        HEADER + live.len() * ENTRY + KNOWN_HEADER + known.len() * KNOWN + CHECKSUM,
    );
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&VERSION.to_le_bytes());
    buf.extend_from_slice(&snapshot.buckets_key.0.to_le_bytes());
    buf.extend_from_slice(&snapshot.buckets_key.1.to_le_bytes());
    buf.extend_from_slice(&wall.to_le_bytes());
    buf.extend_from_slice(&(live.len() as u64).to_le_bytes());
    for (e, left) in &live {
        let (tag, count) = match e.state {
            State::Gcra { .. } => (0u8, 0u32),
            State::FixedWindow { count, .. } => (1, count),
            State::Locked { .. } => (2, 0),
        };
        buf.extend_from_slice(&e.digest);
        buf.push(tag);
        buf.extend_from_slice(&left.to_le_bytes());
        buf.extend_from_slice(&count.to_le_bytes());
    }
    buf.extend_from_slice(&snapshot.known_key.0.to_le_bytes());
    buf.extend_from_slice(&snapshot.known_key.1.to_le_bytes());
    buf.extend_from_slice(&(known.len() as u64).to_le_bytes());
    for k in &known {
        buf.push(u8::from(k.protected));
        buf.extend_from_slice(&k.agent.to_le_bytes());
        buf.extend_from_slice(&k.address.to_le_bytes());
        buf.extend_from_slice(&now.saturating_sub(k.since).to_le_bytes());
        buf.extend_from_slice(&(k.until - now).to_le_bytes());
    }
    let sum = Sha256::digest(&buf);
    buf.extend_from_slice(&sum);

    let (tmp, mut file) = create_temporary(path)?;
    let result = (|| {
        file.write_all(&buf)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename is durable once the directory is.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok((live.len(), known.len()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A new file beside `path`, under a name no one can guess (`.<name>.<16 random hex>.tmp`),
/// created exclusively (never an existing file, never through a symbolic link), readable and
/// writable by its owner only. A name taken meanwhile is tried again under another.
fn create_temporary(path: &Path) -> io::Result<(PathBuf, std::fs::File)> {
    use rand::RngCore;
    let base = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let mut last = io::Error::other("no temporary name could be created");
    for _ in 0..8 {
        let tmp = path.with_file_name(format!(".{base}.{:016x}.tmp", rand::rngs::OsRng.next_u64()));
        match create_private(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

#[cfg(unix)]
fn create_private(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(path)
}

#[cfg(not(unix))]
fn create_private(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Open `path` to read it, never through a symbolic link and never waiting (a FIFO opens at
/// once), so that what it is can be asked of the open file before a byte is read.
#[cfg(unix)]
fn open_to_read(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(
            (rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::CLOEXEC)
                .bits() as i32,
        )
        .open(path)
}

#[cfg(not(unix))]
fn open_to_read(path: &Path) -> io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// What a path that is not a regular file is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// The lock that keeps one state file to one process: `flock` on `<path>.lock`, held until the
/// process exits. Two instances on one state file would each write the buckets it alone saw,
/// the last one winning; the second is refused at start instead. Taking it again in the same
/// process (a library user building a second decider) is allowed.
#[cfg(unix)]
pub(crate) fn lock(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    static HELD: parking_lot::Mutex<Vec<(PathBuf, std::fs::File)>> =
        parking_lot::Mutex::new(Vec::new());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    let lock_path = path.with_file_name(name);
    let mut held = HELD.lock();
    if held.iter().any(|(p, _)| *p == lock_path) {
        return Ok(());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(&lock_path)
        .map_err(|e| {
            format!(
                "cannot open its lock {}: {e}; the directory must be writable by this user, and the lock a regular file",
                lock_path.display()
            )
        })?;
    let regular = file.metadata().map(|m| m.is_file()).unwrap_or(false);
    if !regular {
        return Err(format!(
            "its lock {} is not a regular file; remove it",
            lock_path.display()
        ));
    }
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |e| {
            if e == rustix::io::Errno::WOULDBLOCK {
                format!(
                    "another running instance holds it (its lock {} is taken); give each instance a state file of its own",
                    lock_path.display()
                )
            } else {
                format!("cannot lock {}: {e}", lock_path.display())
            }
        },
    )?;
    held.push((lock_path, file));
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn lock(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// How much a file may hold, and how far ahead: what the configuration can reach.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The store's capacity in buckets.
    pub(crate) buckets: usize,
    /// The known-agents table's capacity in ids.
    pub(crate) known: usize,
    /// The longest window plus lockout of any limiter: no bucket reaches further ahead.
    pub(crate) horizon: Duration,
    /// The longest `known_for` of any `new-agents` limiter.
    pub(crate) known_for: Duration,
}

/// Read `path` at `now` (this process's clock), within `bounds`.
pub(crate) fn read(path: &Path, now: Nanos, bounds: Bounds) -> Read {
    let capacity = bounds.buckets;
    let largest = HEADER
        + capacity.saturating_mul(ENTRY)
        + KNOWN_HEADER
        + bounds.known.saturating_mul(KNOWN)
        + CHECKSUM;
    let file = match open_to_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Read::Missing,
        Err(e) if is_link_refused(&e) => return Read::Refused("a symbolic link".to_owned()),
        Err(e) => return Read::Ignored(format!("cannot read it: {e}")),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Read::Ignored(format!("cannot read it: {e}")),
    };
    if !meta.is_file() {
        return Read::Refused(kind_of(meta.file_type()).to_owned());
    }
    let len = meta.len();
    if len > largest as u64 {
        return Read::Ignored(format!(
            "it is {len} bytes, more than a store of {capacity} buckets writes ({largest})"
        ));
    }
    // Never more than the largest file the store writes, whatever the file says of its size.
    let mut bytes = Vec::with_capacity(len as usize);
    if let Err(e) =
        io::Read::read_to_end(&mut io::Read::take(&file, largest as u64 + 1), &mut bytes)
    {
        return Read::Ignored(format!("cannot read it: {e}"));
    }
    if bytes.len() > largest {
        return Read::Ignored(format!(
            "it grew past {largest} bytes, more than a store of {capacity} buckets writes"
        ));
    }
    let wall_now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    parse(&bytes, now, wall_now, bounds)
}

/// Whether opening failed because the path is a symbolic link (`O_NOFOLLOW`).
fn is_link_refused(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

fn parse(bytes: &[u8], now: Nanos, wall_now: u64, bounds: Bounds) -> Read {
    let capacity = bounds.buckets;
    if bytes.len() < HEADER + KNOWN_HEADER + CHECKSUM || &bytes[..8] != MAGIC {
        return Read::Ignored("it is not a fleet-limiter state file".to_owned());
    }
    let (body, sum) = bytes.split_at(bytes.len() - CHECKSUM);
    if Sha256::digest(body).as_slice() != sum {
        return Read::Ignored("its checksum does not match: it is truncated or corrupt".to_owned());
    }
    let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or([0; 8]));
    let version = u32_at(8);
    if version != VERSION {
        return Read::Ignored(format!(
            "it is of format version {version}; this build reads version {VERSION}"
        ));
    }
    let key = (u64_at(12), u64_at(20));
    let written = u64_at(28);
    let count = u64_at(36);
    let buckets_end = (count as usize)
        .checked_mul(ENTRY)
        .and_then(|n| n.checked_add(HEADER))
        .filter(|end| end + KNOWN_HEADER <= body.len());
    let Some(buckets_end) = buckets_end else {
        return Read::Ignored(format!(
            "it says {count} buckets but holds {} bytes",
            body.len()
        ));
    };
    if count as usize > capacity {
        return Read::Ignored(format!(
            "it holds {count} buckets, more than this store's {capacity}"
        ));
    }
    let known_key = (u64_at(buckets_end), u64_at(buckets_end + 8));
    let known_count = u64_at(buckets_end + 16);
    let known_start = buckets_end + KNOWN_HEADER;
    if (known_count as usize).checked_mul(KNOWN) != Some(body.len() - known_start) {
        return Read::Ignored(format!(
            "it says {known_count} known agents but holds {} bytes of them",
            body.len() - known_start
        ));
    }
    if known_count as usize > bounds.known {
        return Read::Ignored(format!(
            "it holds {known_count} known agents, more than this table's {}",
            bounds.known
        ));
    }
    // A clock that went backwards: no time passed.
    let elapsed = wall_now.saturating_sub(written);
    let nanos = |d: Duration| d.as_nanos().min(u64::MAX as u128) as u64;
    let (horizon, known_for) = (nanos(bounds.horizon), nanos(bounds.known_for));
    let mut restored = Restored {
        snapshot: Snapshot {
            buckets_key: key,
            buckets: Vec::with_capacity(count as usize),
            known_key,
            known: Vec::with_capacity(known_count as usize),
        },
        expired: 0,
        out_of_range: 0,
        elapsed: Duration::from_nanos(elapsed),
    };
    for chunk in body[HEADER..buckets_end].chunks_exact(ENTRY) {
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&chunk[..16]);
        let tag = chunk[16];
        let left = u64::from_le_bytes(chunk[17..25].try_into().unwrap_or([0; 8]));
        let count = u32::from_le_bytes(chunk[25..29].try_into().unwrap_or([0; 4]));
        if left > horizon || tag > 2 {
            restored.out_of_range += 1;
            continue;
        }
        let Some(left) = left.checked_sub(elapsed).filter(|l| *l > 0) else {
            restored.expired += 1;
            continue;
        };
        let at = now.saturating_add(left);
        let state = match tag {
            0 => State::Gcra { tat: at },
            1 => State::FixedWindow { ends_at: at, count },
            _ => State::Locked { until: at },
        };
        restored.snapshot.buckets.push(Entry { digest, state });
    }
    for chunk in body[known_start..].chunks_exact(KNOWN) {
        let word = |i: usize| u64::from_le_bytes(chunk[i..i + 8].try_into().unwrap_or([0; 8]));
        let (segment, agent, address, age, left) = (chunk[0], word(1), word(9), word(17), word(25));
        if left > known_for || segment > 1 {
            restored.out_of_range += 1;
            continue;
        }
        let Some(left) = left.checked_sub(elapsed).filter(|l| *l > 0) else {
            restored.expired += 1;
            continue;
        };
        restored.snapshot.known.push(Kept {
            protected: segment == 1,
            agent,
            address,
            since: now.saturating_sub(age.saturating_add(elapsed)),
            until: now.saturating_add(left),
        });
    }
    Read::Restored(restored)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Nanos = 1_000_000_000;

    fn bounds(buckets: usize, horizon_secs: u64) -> Bounds {
        Bounds {
            buckets,
            known: 100,
            horizon: Duration::from_secs(horizon_secs),
            known_for: Duration::from_secs(3_600),
        }
    }

    fn snapshot(now: Nanos) -> Snapshot {
        Snapshot {
            buckets_key: (11, 22),
            buckets: vec![
                Entry {
                    digest: [1; 16],
                    state: State::Gcra {
                        tat: now + 90 * SEC,
                    },
                },
                Entry {
                    digest: [2; 16],
                    state: State::FixedWindow {
                        ends_at: now + 30 * SEC,
                        count: 7,
                    },
                },
                Entry {
                    digest: [3; 16],
                    state: State::Locked {
                        until: now + 600 * SEC,
                    },
                },
                // Already full again: not written.
                Entry {
                    digest: [4; 16],
                    state: State::Gcra { tat: now - SEC },
                },
            ],
            known_key: (33, 44),
            known: vec![
                Kept {
                    protected: false,
                    agent: 5,
                    address: 6,
                    since: now - 10 * SEC,
                    until: now + 50 * SEC,
                },
                Kept {
                    protected: true,
                    agent: 7,
                    address: 6,
                    since: now - 20 * SEC,
                    until: now + 1_000 * SEC,
                },
                // Expired: not written.
                Kept {
                    protected: true,
                    agent: 8,
                    address: 6,
                    since: now - 90 * SEC,
                    until: now,
                },
            ],
        }
    }

    fn written(now: Nanos) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        assert_eq!(write(&path, now, &snapshot(now)).unwrap(), (3, 2));
        (dir, path)
    }

    fn restored(r: Read) -> Restored {
        match r {
            Read::Restored(r) => r,
            other => panic!("not restored: {other:?}"),
        }
    }

    fn wall_of(bytes: &[u8]) -> u64 {
        u64::from_le_bytes(bytes[28..36].try_into().unwrap())
    }

    #[test]
    fn what_is_left_is_restored_on_another_clock() {
        let (_dir, path) = written(1_000 * SEC);
        let bytes = std::fs::read(&path).unwrap();
        // The next process's clock starts elsewhere; no wall time has passed.
        let r = restored(parse(
            &bytes,
            5_000 * SEC,
            wall_of(&bytes),
            bounds(100, 3_600),
        ));
        let s = r.snapshot;
        assert_eq!((s.buckets_key, s.known_key), ((11, 22), (33, 44)));
        assert_eq!(s.buckets.len(), 3);
        assert_eq!(s.buckets[0].state, State::Gcra { tat: 5_090 * SEC });
        assert_eq!(
            s.buckets[1].state,
            State::FixedWindow {
                ends_at: 5_030 * SEC,
                count: 7
            }
        );
        assert_eq!(s.buckets[2].state, State::Locked { until: 5_600 * SEC });
        assert_eq!(
            s.known,
            [
                Kept {
                    protected: false,
                    agent: 5,
                    address: 6,
                    since: 4_990 * SEC,
                    until: 5_050 * SEC
                },
                Kept {
                    protected: true,
                    agent: 7,
                    address: 6,
                    since: 4_980 * SEC,
                    until: 6_000 * SEC
                },
            ]
        );
        // Read from the file as a start does, the same.
        let again = restored(read(&path, 5_000 * SEC, bounds(100, 3_600)));
        assert_eq!(again.snapshot.buckets.len(), 3);
    }

    #[test]
    fn time_that_passed_is_counted_and_a_clock_that_went_back_counts_none() {
        let (_dir, path) = written(1_000 * SEC);
        let bytes = std::fs::read(&path).unwrap();
        let wall = wall_of(&bytes);
        // 60 s later: the fixed window (30 s left) and the probationary id (50 s) are over.
        let r = restored(parse(&bytes, 0, wall + 60 * SEC, bounds(100, 3_600)));
        assert_eq!(r.expired, 2);
        assert_eq!(r.snapshot.buckets[0].state, State::Gcra { tat: 30 * SEC });
        assert_eq!(
            r.snapshot.buckets[1].state,
            State::Locked { until: 540 * SEC }
        );
        assert_eq!(r.snapshot.known.len(), 1);
        assert_eq!(r.snapshot.known[0].until, 940 * SEC);
        // The wall clock an hour behind the writer's: nothing passed, nothing is forgiven.
        let r = restored(parse(&bytes, 0, wall - 3_600 * SEC, bounds(100, 3_600)));
        assert_eq!(r.snapshot.buckets.len(), 3);
        assert_eq!(
            r.snapshot.buckets[2].state,
            State::Locked { until: 600 * SEC }
        );
    }

    #[test]
    fn hostile_files_are_ignored_whole_or_entry_by_entry() {
        let (dir, path) = written(1_000 * SEC);
        let good = std::fs::read(&path).unwrap();
        let wall = wall_of(&good);
        let why = |bytes: &[u8]| match parse(bytes, 0, wall, bounds(100, 3_600)) {
            Read::Ignored(why) => why,
            other => panic!("accepted: {other:?}"),
        };
        assert!(why(&good[..good.len() - 1]).contains("checksum"));
        assert!(why(&good[..10]).contains("not a fleet-limiter state file"));
        assert!(why(b"").contains("not a fleet-limiter state file"));
        let mut flipped = good.clone();
        flipped[HEADER + 20] ^= 1;
        assert!(why(&flipped).contains("checksum"));
        // Re-summed after a change, so that only the change is judged.
        let resummed = |at: usize, byte: u8| {
            let mut b = good[..good.len() - CHECKSUM].to_vec();
            b[at] = byte;
            let sum = Sha256::digest(&b);
            b.extend_from_slice(&sum);
            b
        };
        assert!(why(&resummed(8, 9)).contains("version 9"));
        assert!(why(&resummed(36, 200)).contains("says 200 buckets"));
        let known_count = HEADER + 3 * ENTRY + 16;
        assert!(why(&resummed(known_count, 9)).contains("says 9 known agents"));
        // More than the store or the table holds.
        match parse(&good, 0, wall, bounds(2, 3_600)) {
            Read::Ignored(why) => assert!(why.contains("more than this store's 2"), "{why}"),
            other => panic!("{other:?}"),
        }
        let small_table = Bounds {
            known: 1,
            ..bounds(100, 3_600)
        };
        match parse(&good, 0, wall, small_table) {
            Read::Ignored(why) => assert!(why.contains("more than this table's 1"), "{why}"),
            other => panic!("{other:?}"),
        }
        match read(
            &path,
            0,
            Bounds {
                known: 0,
                ..bounds(0, 3_600)
            },
        ) {
            Read::Ignored(why) => assert!(why.contains("bytes, more than a store of 0"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A state further ahead than any limiter reaches is not restored, nor an id known for
        // longer than any limiter remembers one.
        let r = restored(parse(&good, 0, wall, bounds(100, 100)));
        assert_eq!((r.snapshot.buckets.len(), r.out_of_range), (2, 1));
        let short = Bounds {
            known_for: Duration::from_secs(60),
            ..bounds(100, 3_600)
        };
        let r = restored(parse(&good, 0, wall, short));
        assert_eq!((r.snapshot.known.len(), r.out_of_range), (1, 1));
        // An unknown tag or segment is not restored either.
        let r = restored(parse(
            &resummed(HEADER + 16, 7),
            0,
            wall,
            bounds(100, 3_600),
        ));
        assert_eq!((r.snapshot.buckets.len(), r.out_of_range), (2, 1));
        // No file: a first start.
        assert!(matches!(
            read(&dir.path().join("none"), 0, bounds(10, 60)),
            Read::Missing
        ));
    }

    #[test]
    fn the_file_is_replaced_whole_and_readable_by_its_owner_only() {
        let (dir, path) = written(1_000 * SEC);
        let empty = Snapshot {
            buckets_key: (1, 2),
            ..Snapshot::default()
        };
        assert_eq!(write(&path, 0, &empty).unwrap(), (0, 0));
        let r = restored(read(&path, 0, bounds(10, 60)));
        assert_eq!(r.snapshot.buckets_key, (1, 2));
        assert!(r.snapshot.buckets.is_empty() && r.snapshot.known.is_empty());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
