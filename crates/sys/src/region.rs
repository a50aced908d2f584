//! [`SharedRegion`]: memory that several processes map, backed by a memfd.
//!
//! The creator names it and gives its size; the memfd is sealed so that its size can never
//! change (no peer can truncate it under us, which would turn our next access into SIGBUS).
//! Another process maps the same pages from the descriptor, inherited across `exec` or
//! received over a unix socket ([`fdpass`](crate::fdpass)), and insists on that seal.
//!
//! The mapping is `memmap2::MmapRaw`: it maps and unmaps without `unsafe` on our side and hands
//! out raw pointers only, which is what memory another process writes calls for. `rustix`
//! creates, sizes and seals the memfd. What the region offers on top is safe: its length, its
//! base pointer, its descriptor, and atomics at validated offsets; turning the pointer into
//! anything else is [`ring`](crate::ring)'s business.
#![allow(unsafe_code)]

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{
    fcntl_add_seals, fcntl_get_seals, fstat, ftruncate, memfd_create, MemfdFlags, SealFlags,
};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A shared mapping of a whole memfd, unmapped on drop; the descriptor stays open with it
/// (unless mapped with [`SharedRegion::map_fd`]).
pub struct SharedRegion {
    map: MmapRaw,
    fd: Option<OwnedFd>,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("fd", &self.fd.as_ref().map(|f| f.as_raw_fd()))
            .field("len", &self.len())
            .finish()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl SharedRegion {
    /// Creates a zero-filled region of `len` bytes in a new memfd called `name` (the name is
    /// only a label, shown in `/proc/PID/fd`). The descriptor is close-on-exec; see
    /// [`SharedRegion::set_inheritable`] to hand it to a child process.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(invalid("a shared region needs at least one byte".into()));
        }
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, len as u64)?;
        // The size is fixed for good: peers map it without fearing SIGBUS.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map(fd, len)
    }

    /// Maps the whole of a memfd created by [`SharedRegion::create`], here or in another
    /// process. The memfd must be sealed against shrinking (else the other process could
    /// truncate it and crash us on the next access): anything else is refused.
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let map = Self::map_sealed(&fd)?;
        Ok(Self { map, fd: Some(fd) })
    }

    /// [`SharedRegion::from_fd`] that closes the descriptor once mapped (the mapping keeps
    /// the file): for a process that never passes the region on, e.g. an application under
    /// the preload shim, whose descriptors the program could otherwise hit (`ownfd`).
    /// [`SharedRegion::fd`], [`SharedRegion::raw_fd`] and
    /// [`SharedRegion::set_inheritable`] must not be called on it.
    pub fn map_fd(fd: OwnedFd) -> io::Result<Self> {
        let map = Self::map_sealed(&fd)?;
        Ok(Self { map, fd: None })
    }

    /// Checks that `fd` is a memfd sealed against shrinking, and maps all of it.
    fn map_sealed(fd: &OwnedFd) -> io::Result<MmapRaw> {
        let seals = fcntl_get_seals(fd).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a sealable memfd ({e})"),
            )
        })?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(invalid(
                "memfd not sealed against shrinking: refusing to map it".into(),
            ));
        }
        let size = fstat(fd)?.st_size;
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| invalid(format!("cannot map a memfd of {size} bytes")))?;
        MmapOptions::new().len(len).map_raw(fd)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        let map = MmapOptions::new().len(len).map_raw(&fd)?;
        Ok(Self { map, fd: Some(fd) })
    }

    fn kept(&self) -> &OwnedFd {
        self.fd
            .as_ref()
            .expect("a region mapped with `map_fd` keeps no descriptor")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The first byte (page-aligned). Valid for [`SharedRegion::len`] bytes while `self`
    /// lives; other processes may write any of it at any time.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The memfd, e.g. to pass to another process with [`fdpass`](crate::fdpass).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.kept().as_fd()
    }

    /// The memfd's number, e.g. to name on a child's command line.
    pub fn raw_fd(&self) -> RawFd {
        self.kept().as_raw_fd()
    }

    /// Lets child processes inherit the descriptor across `exec` (clears close-on-exec), or
    /// stops them from doing so.
    pub fn set_inheritable(&self, inheritable: bool) -> io::Result<()> {
        let flags = if inheritable {
            rustix::io::FdFlags::empty()
        } else {
            rustix::io::FdFlags::CLOEXEC
        };
        rustix::io::fcntl_setfd(self.kept(), flags)?;
        Ok(())
    }

    /// The 32-bit atomic at byte `offset`, if it lies inside and is 4-byte aligned.
    pub fn atomic_u32(&self, offset: usize) -> Option<&AtomicU32> {
        let p = self.checked(offset, std::mem::size_of::<AtomicU32>())?;
        // SAFETY: `p` is in the mapping (checked) and aligned for AtomicU32 (checked); the
        // mapping lives as long as the returned borrow of `self`. Every bit pattern is a valid
        // u32, and the kernel makes atomics on shared pages atomic across processes, so
        // concurrent writes from other processes are no data race on this word.
        Some(unsafe { &*(p as *const AtomicU32) })
    }

    /// The 64-bit atomic at byte `offset`, if it lies inside and is 8-byte aligned.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        let p = self.checked(offset, std::mem::size_of::<AtomicU64>())?;
        // SAFETY: as in `atomic_u32`, for 8 bytes at an 8-byte aligned address.
        Some(unsafe { &*(p as *const AtomicU64) })
    }

    /// Copies `src` into the region at byte `offset`; `None` (nothing written) if the span
    /// does not lie inside the region.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Option<()> {
        let end = offset.checked_add(src.len())?;
        if end > self.len() {
            return None;
        }
        // SAFETY: [offset, end) lies inside the mapping (checked), which lives as long as
        // `self`; `src` is ordinary memory of this process, so the two never overlap. Another
        // process may write the same bytes meanwhile: the result is then garbage bytes in
        // shared memory, which every reader treats as untrusted input anyway.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset), src.len())
        };
        Some(())
    }

    /// Copies the region's bytes at `offset..offset + dst.len()` into `dst`; `None` (nothing
    /// read) if the span does not lie inside the region. The bytes are untrusted input.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(dst.len())?;
        if end > self.len() {
            return None;
        }
        // SAFETY: as in `write_at`, in the other direction; `u8` is valid for any bytes, so
        // whatever a peer wrote there is a valid (if meaningless) value.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), dst.as_mut_ptr(), dst.len())
        };
        Some(())
    }

    /// The region's bytes at `offset..offset + len` borrowed in place (no copy), for memory
    /// handed to the daemon to send from (a zero-copy transmit span); `None` if the span does
    /// not lie inside the region. The other process may write these bytes while they are
    /// borrowed: they are payload only — copied into frames or receive rings, never parsed or
    /// used to uphold an invariant — so a writer garbles its own stream and nothing else (as
    /// with `MSG_ZEROCOPY`).
    pub fn peer_bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // SAFETY: [offset, end) lies inside the mapping (checked), which lives as long as the
        // returned borrow of `self`; `u8` is valid for any bit pattern. The mapping is shared
        // with a process we do not control, which may store into these bytes concurrently:
        // readers only copy them out (as `MappedWindow::bytes` does with a file's pages), so
        // a concurrent store can change which bytes are sent, never the daemon's state.
        Some(unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset), len) })
    }

    /// Pointer to `size` bytes at `offset`, if they lie inside and are `size`-aligned.
    fn checked(&self, offset: usize, size: usize) -> Option<*mut u8> {
        let end = offset.checked_add(size)?;
        if end > self.len() {
            return None;
        }
        let p = self.as_ptr().wrapping_add(offset);
        (p as usize).is_multiple_of(size).then_some(p)
    }
}

impl AsFd for SharedRegion {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.kept().as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_see_the_same_bytes() {
        let a = SharedRegion::create("region-test", 3 * 4096 + 10).unwrap();
        assert_eq!(a.len(), 3 * 4096 + 10);
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        let b = SharedRegion::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(b.len(), a.len());
        assert_ne!(a.as_ptr(), b.as_ptr());
        a.atomic_u64(8)
            .unwrap()
            .store(0x1122_3344_5566_7788, Ordering::SeqCst);
        assert_eq!(
            b.atomic_u64(8).unwrap().load(Ordering::SeqCst),
            0x1122_3344_5566_7788
        );
        assert_eq!(b.atomic_u32(8).unwrap().load(Ordering::SeqCst), 0x5566_7788);
    }

    #[test]
    fn map_fd_closes_the_descriptor_and_keeps_the_shared_mapping() {
        // A name no other test uses: tests run as threads of one process, and one of them
        // may open a file at the number closed here, so the check is "the number no longer
        // names this memfd", not "the number is free".
        let a = SharedRegion::create("region-test-map-fd", 4096).unwrap();
        let dup = a.fd().try_clone_to_owned().unwrap();
        let n = dup.as_raw_fd();
        let names = || std::fs::read_link(format!("/proc/self/fd/{n}")).ok();
        let was = names().unwrap();
        let b = SharedRegion::map_fd(dup).unwrap();
        assert_ne!(names(), Some(was));
        a.atomic_u64(16).unwrap().store(42, Ordering::SeqCst);
        assert_eq!(b.atomic_u64(16).unwrap().load(Ordering::SeqCst), 42);
        // The same checks as `from_fd`: an unsealed file is refused.
        let (s, _) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(SharedRegion::map_fd(s.into()).is_err());
    }

    #[test]
    fn atomics_out_of_range_or_misaligned_are_refused() {
        let r = SharedRegion::create("region-test", 64).unwrap();
        assert!(r.atomic_u32(60).is_some());
        assert!(r.atomic_u32(61).is_none());
        assert!(r.atomic_u32(64).is_none());
        assert!(r.atomic_u64(56).is_some());
        assert!(r.atomic_u64(60).is_none());
        assert!(r.atomic_u64(usize::MAX).is_none());
    }

    #[test]
    fn byte_copies_are_bounds_checked() {
        let a = SharedRegion::create("region-test", 100).unwrap();
        let b = SharedRegion::from_fd(a.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(a.write_at(90, b"0123456789"), Some(()));
        let mut got = [0u8; 10];
        assert_eq!(b.read_at(90, &mut got), Some(()));
        assert_eq!(&got, b"0123456789");
        assert_eq!(a.write_at(91, b"0123456789"), None);
        assert_eq!(b.read_at(usize::MAX, &mut got), None);
    }

    #[test]
    fn size_is_sealed() {
        let r = SharedRegion::create("region-test", 4096).unwrap();
        assert!(ftruncate(r.fd(), 1).is_err(), "cannot shrink");
        assert!(ftruncate(r.fd(), 8192).is_err(), "cannot grow");
    }

    #[test]
    fn unsealed_or_empty_memfds_are_refused() {
        let fd = memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, 4096).unwrap();
        assert!(SharedRegion::from_fd(fd).is_err(), "shrinkable");
        let fd = memfd_create("empty", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
        assert!(SharedRegion::from_fd(fd).is_err(), "empty");
        let (s, _) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(SharedRegion::from_fd(s.into()).is_err(), "not a memfd");
        assert!(SharedRegion::create("zero", 0).is_err());
    }

    #[test]
    fn inheritable_toggles_close_on_exec() {
        let r = SharedRegion::create("region-test", 4096).unwrap();
        let cloexec = || {
            rustix::io::fcntl_getfd(r.fd())
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
        };
        assert!(cloexec());
        r.set_inheritable(true).unwrap();
        assert!(!cloexec());
        r.set_inheritable(false).unwrap();
        assert!(cloexec());
    }
}
