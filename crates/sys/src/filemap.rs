//! Read-only windows of a file mapped shared (`MAP_SHARED`), and the process-wide `SIGBUS`
//! guard that keeps a truncated file from killing the process.
//!
//! # Why a guard
//!
//! Touching a page of a file mapping that lies wholly past the file's end raises `SIGBUS`
//! (mmap(2)): a file truncated while a window of it is being read would kill the process
//! wherever the read happens — for `send_file`, deep in segment output. The guard makes such
//! a fault survivable and visible:
//!
//! - every [`MappedWindow`] is registered, while it is mapped, in a fixed table of
//!   [`SLOTS`] entries made of atomics only (the signal handler reads it, so no lock and no
//!   allocation); a full table makes [`MappedWindow::map`] fail and the caller does not map;
//! - the handler, installed once on the first mapping, looks the faulting address up in the
//!   table. Inside a registered window it maps an anonymous zero page over the faulting page
//!   (`mmap(MAP_FIXED)`), marks the window truncated ([`MappedWindow::truncated`]), bumps
//!   [`truncations`], and returns: the interrupted read resumes and reads zeros;
//! - any other `SIGBUS` goes where it went before the guard: to the previously installed
//!   handler if there was one (called with the same arguments), otherwise the previous
//!   disposition is restored and the signal raised again, so an unrelated bus error still
//!   kills the process (with its core dump) exactly as without the guard.
//!
//! The zero bytes are not file bytes: whoever reads a window must check
//! [`MappedWindow::truncated`] after reading and before trusting what it read (the engine
//! does, before any frame leaves; see `flowstack-stack`'s `engine/file_map.rs`). A file cut
//! inside a page is not caught by the guard at all — the rest of that page reads as zeros
//! without a fault — so a reader also compares the file's size with the window's end.
//!
//! # Table protocol
//!
//! A slot is claimed with a compare-and-swap on `owned`; its `(start, len)` pair is written
//! between two increments of a sequence number (odd while it changes). The handler reads the
//! sequence, the pair, and the sequence again, and trusts the pair only if the sequence was
//! even and unchanged. A window is unregistered before it is unmapped, so a fault on an
//! address that is being unmapped is not ours and is passed on.

#![allow(unsafe_code)]

use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;
use std::io;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

/// Windows that can be registered at once, process-wide.
pub const SLOTS: usize = 256;

struct Slot {
    owned: AtomicBool,
    seq: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    truncated: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            owned: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            truncated: AtomicBool::new(false),
        }
    }

    fn set(&self, start: usize, len: usize) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        self.start.store(start, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.truncated.store(false, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// Whether `addr` lies in this slot's window (a consistent read of the pair).
    fn covers(&self, addr: usize) -> bool {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 % 2 == 1 {
            return false;
        }
        let start = self.start.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let s2 = self.seq.load(Ordering::Relaxed);
        s1 == s2 && start != 0 && addr >= start && addr - start < len
    }
}

static TABLE: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static TRUNCATIONS: AtomicU64 = AtomicU64::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// The disposition before ours: written once, before ours is installed, read by the handler.
static mut PREVIOUS: Option<libc::sigaction> = None;

/// How many faults the guard has absorbed in this process (0 on a quiet run): a cheap check
/// that nothing was truncated under any window since the last look.
pub fn truncations() -> u64 {
    TRUNCATIONS.load(Ordering::Acquire)
}

/// Whether the guard's handler is installed (after the first successful [`MappedWindow::map`]).
pub fn guard_installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf with a valid name has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

fn install() -> io::Result<()> {
    INSTALL.call_once(|| {
        PAGE.store(page_size(), Ordering::Relaxed);
        // SAFETY: plain sigaction(2) calls with valid, zero-initialised structs. PREVIOUS is
        // written here once (under the Once, before the handler that reads it is installed)
        // and never again.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            *std::ptr::addr_of_mut!(PREVIOUS) = Some(old);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
    if guard_installed() {
        Ok(())
    } else {
        Err(io::Error::other("the SIGBUS guard could not be installed"))
    }
}

/// The handler: absorbs faults inside registered windows, passes every other SIGBUS on.
/// Async-signal-safe: atomics, `mmap`, `sigaction`, `raise` only.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo (SA_SIGINFO); si_addr is meaningful for the
    // fault codes (BUS_ADRERR and friends), and for a kill(2)-sent SIGBUS (si_code <= 0) we
    // do not look at it.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code > 0 {
        for s in &TABLE {
            if !s.covers(addr) {
                continue;
            }
            let page = PAGE.load(Ordering::Relaxed);
            let at = addr & !(page - 1);
            // SAFETY: `at` is a page inside a registered window, a mapping this process owns
            // and keeps mapped until it unregisters the window; replacing that one page with
            // an anonymous zero page (MAP_FIXED) changes nothing but what the page reads as.
            let p = unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                break; // cannot repair: fall through to the previous disposition
            }
            s.truncated.store(true, Ordering::Release);
            TRUNCATIONS.fetch_add(1, Ordering::AcqRel);
            return;
        }
    }
    // Not ours. SAFETY: PREVIOUS was written before this handler was installed and is never
    // written again; calling the previous handler with our own arguments is what the kernel
    // would have done without us; sigaction and raise are async-signal-safe.
    unsafe {
        let prev = *std::ptr::addr_of!(PREVIOUS);
        let Some(prev) = prev else {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            libc::raise(libc::SIGBUS);
            return;
        };
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            // Restore and raise again: pending now, delivered with the old disposition as this
            // handler returns (a fault would also recur on the faulting instruction).
            libc::sigaction(libc::SIGBUS, &prev, std::ptr::null_mut());
            libc::raise(libc::SIGBUS);
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(sig);
        }
    }
}

/// How a window's pages are brought in when it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Populate {
    /// `MAP_POPULATE`: page tables filled by the `mmap` call itself (no fault when read).
    Map,
    /// `madvise(MADV_WILLNEED)`: read-ahead started; each page still faults once when read.
    WillNeed,
    /// Neither: every page faults on first touch.
    Lazy,
}

/// A read-only window of a file, mapped shared and registered with the `SIGBUS` guard for
/// as long as it lives; unmapped when dropped.
pub struct MappedWindow {
    map: MmapRaw,
    slot: usize,
    /// The window's bytes are `map[skip..skip + len]`.
    skip: usize,
    len: usize,
    offset: u64,
}

impl std::fmt::Debug for MappedWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedWindow")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("truncated", &self.truncated())
            .finish()
    }
}

impl MappedWindow {
    /// Maps `len` (> 0) bytes of `file` from `offset` (any offset: the mapping starts at the
    /// page below it) and registers them with the guard, installing it on first use. Fails if
    /// the guard cannot be installed, every slot is taken, or `mmap` fails.
    pub fn map(file: &File, offset: u64, len: usize, populate: Populate) -> io::Result<Self> {
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        install()?;
        let page = PAGE.load(Ordering::Relaxed) as u64;
        let base = offset & !(page - 1);
        let skip = (offset - base) as usize;
        let mut o = MmapOptions::new();
        o.offset(base).len(skip + len);
        if populate == Populate::Map {
            o.populate();
        }
        let slot = TABLE
            .iter()
            .position(|s| {
                s.owned
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or_else(|| io::Error::other("every SIGBUS guard slot is taken"))?;
        let map = match o.map_raw_read_only(file) {
            Ok(m) => m,
            Err(e) => {
                TABLE[slot].owned.store(false, Ordering::Release);
                return Err(e);
            }
        };
        TABLE[slot].set(map.as_ptr() as usize, map.len());
        if populate == Populate::WillNeed {
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
        Ok(Self {
            map,
            slot,
            skip,
            len,
            offset,
        })
    }

    /// The file offset of the window's first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a window holds at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The window's bytes, read straight from the page cache. A page past the file's end
    /// reads as zeros (the guard's repair): check [`MappedWindow::truncated`] after reading.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `map` is a live read-only mapping of skip + len bytes owned by self (the
        // slice cannot outlive it). Its contents may change while borrowed if the file is
        // written — as with any shared mapping, the bytes are only ever copied out, never
        // used to uphold an invariant — and a page past the end of a truncated file is
        // replaced by a zero page by the guard instead of faulting fatally.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(self.skip), self.len) }
    }

    /// Whether the guard absorbed a fault in this window: its file was truncated under it and
    /// some of its bytes read as zeros.
    pub fn truncated(&self) -> bool {
        TABLE[self.slot].truncated.load(Ordering::Acquire)
    }
}

impl AsRef<[u8]> for MappedWindow {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Drop for MappedWindow {
    fn drop(&mut self) {
        // Unregister before `map` is unmapped (after this body).
        let s = &TABLE[self.slot];
        s.set(0, 0);
        s.owned.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8]) -> (std::path::PathBuf, File) {
        let p = std::env::temp_dir().join(format!(
            "flowstack-filemap-{}-{}.bin",
            std::process::id(),
            bytes.len()
        ));
        let mut f = File::create(&p).unwrap();
        f.write_all(bytes).unwrap();
        (p.clone(), File::open(&p).unwrap())
    }

    #[test]
    fn a_window_reads_the_file_from_any_offset() {
        let data: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i * 7 % 251) as u8).collect();
        let (p, f) = file_of(&data);
        for (off, len) in [(0, 1), (1, 4095), (4095, 4097), (5000, 7000)] {
            for pop in [Populate::Map, Populate::WillNeed, Populate::Lazy] {
                let w = MappedWindow::map(&f, off as u64, len, pop).unwrap();
                assert_eq!(w.bytes(), &data[off..off + len]);
                assert!(!w.truncated());
            }
        }
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn a_page_past_a_truncated_end_reads_as_zeros_and_marks_the_window() {
        let page = page_size();
        let data = vec![0xabu8; 4 * page];
        let (p, f) = file_of(&data);
        let w = MappedWindow::map(&f, 0, 4 * page, Populate::Lazy).unwrap();
        let before = truncations();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(page as u64)
            .unwrap();
        let b = w.bytes();
        assert_eq!(b[0], 0xab);
        assert_eq!(b[2 * page + 5], 0, "a page past the end reads as zeros");
        assert!(w.truncated());
        assert!(truncations() > before);
        drop(w);
        std::fs::remove_file(p).unwrap();
    }
}
