//! The `SIGBUS` guard (`flowstack_sys::filemap`) absorbs faults inside registered windows only:
//! a bus error anywhere else still kills the process, guard installed or not. Each case runs
//! in a child process (this test binary again, told what to do by an environment variable).

use flowstack_sys::filemap::{page_size, MappedWindow, Populate};
use std::fs::File;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

const CHILD: &str = "FLOWSTACK_SIGBUS_CHILD";

/// A `pages`-page file of 0x5a bytes, and its path.
fn file(tag: &str, pages: usize) -> (std::path::PathBuf, File) {
    let p = std::env::temp_dir().join(format!("fs-sigbus-{}-{tag}", std::process::id()));
    let mut f = File::create(&p).unwrap();
    f.write_all(&vec![0x5a; pages * page_size()]).unwrap();
    (p.clone(), File::open(&p).unwrap())
}

fn truncate(p: &std::path::Path) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .unwrap()
        .set_len(0)
        .unwrap();
}

/// What a child does: `guard` installs the guard first (a window of another file);
/// `registered` faults inside a registered window instead of an unregistered mapping.
fn child(guard: bool, registered: bool) {
    let (pa, fa) = file("a", 4);
    let (pb, fb) = file("b", 4);
    let _w = guard.then(|| MappedWindow::map(&fa, 0, 4 * page_size(), Populate::Lazy).unwrap());
    if registered {
        let w = MappedWindow::map(&fb, 0, 4 * page_size(), Populate::Lazy).unwrap();
        truncate(&pb);
        let x = std::hint::black_box(w.bytes()[2 * page_size()]);
        assert_eq!(x, 0);
        assert!(w.truncated());
    } else {
        // SAFETY: a private read-only mapping of a file this process created; reading it after
        // the truncation is meant to raise SIGBUS (the point of the test).
        let m = unsafe { memmap2::Mmap::map(&fb).unwrap() };
        truncate(&pb);
        let x = std::hint::black_box(m[2 * page_size()]);
        println!("read {x} past the end and lived");
    }
    let _ = std::fs::remove_file(pa);
    let _ = std::fs::remove_file(pb);
}

/// Runs `case` in a child; its exit status.
fn run(case: &str) -> std::process::ExitStatus {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .output()
        .unwrap()
        .status
}

#[test]
fn child_entry() {
    match std::env::var(CHILD).as_deref() {
        Ok("plain") => child(false, false),
        Ok("guarded") => child(true, false),
        Ok("registered") => child(true, true),
        _ => {} // not a child: nothing to do
    }
}

#[test]
fn unrelated_sigbus_is_still_fatal() {
    // Without the guard: the baseline.
    assert_eq!(run("plain").signal(), Some(libc::SIGBUS));
    // With the guard installed, a fault outside every registered window still kills.
    assert_eq!(run("guarded").signal(), Some(libc::SIGBUS));
    // A fault inside a registered window does not.
    let s = run("registered");
    assert!(s.success(), "{s:?}");
}
