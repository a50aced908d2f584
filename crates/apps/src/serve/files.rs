//! Request paths to files under the served root, and their content types.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Files whose paths the cache keeps open (like nginx's `open_file_cache max=`). Small files
/// hold no descriptor; large ones hold one each, so this bounds the descriptors too.
pub const FILE_CACHE_ENTRIES: usize = 256;
/// How long a cached file is trusted before one `stat` of its path checks that it is still
/// the same file (device, inode, length, mtime) — nginx's `open_file_cache_valid`. A file
/// replaced, changed or removed on disk is served fresh (or 404) at most this much later.
pub const FILE_CACHE_VALID: Duration = Duration::from_millis(1000);
/// Files up to this size are kept in memory and sent with their head in one buffer.
pub const SMALL_FILE: u64 = 16 * 1024;

/// Maps a request target to a file under `root` (a canonical path), refusing anything that
/// escapes it: `Err(400)` for a target that is not an absolute path, does not decode, or
/// holds `.`/`..` components; `Err(404)` for one that does not exist or resolves (through
/// symlinks) outside the root. A directory maps to its `index.html`.
pub fn resolve(root: &Path, target: &str) -> Result<PathBuf, u16> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(400);
    }
    let decoded = percent_decode(path).ok_or(400u16)?;
    let mut out = root.to_path_buf();
    for comp in Path::new(&decoded).components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(p) => out.push(p),
            // "..", "." or a prefix: refuse rather than interpret.
            _ => return Err(400),
        }
    }
    if out.is_dir() {
        out.push("index.html");
    }
    // Symlinks could still point outside: compare canonical paths.
    let canon = out.canonicalize().map_err(|_| 404u16)?;
    if !canon.starts_with(root) {
        return Err(404);
    }
    Ok(canon)
}

/// An open file the server answers from.
#[derive(Debug)]
pub struct CachedFile {
    /// Its canonical path (under the root).
    pub path: PathBuf,
    /// Its length when opened.
    pub len: u64,
    /// The Content-Type of its extension.
    pub ctype: &'static str,
    /// The whole content, for a file of at most [`SMALL_FILE`] bytes.
    pub bytes: Option<Arc<[u8]>>,
    /// The open file, for a larger one (bodies are sent from it by offset).
    pub file: Option<Arc<File>>,
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
}

#[derive(Debug)]
struct Slot {
    f: Arc<CachedFile>,
    /// When the file was last opened or checked against its path.
    checked: Instant,
    /// Last lookup, for evicting the least recently used.
    used: u64,
}

/// A bounded cache of open files keyed by request path, as nginx's `open_file_cache`: a hit
/// within [`FILE_CACHE_VALID`] (or the window given) costs no system call; after it, one
/// `stat` of the canonical path revalidates the entry; a miss resolves the path through
/// [`resolve`] (canonicalised, symlinks checked), opens it and reads a small file whole.
/// Errors (400/404) are not cached.
#[derive(Debug)]
pub struct FileCache {
    root: PathBuf,
    slots: HashMap<String, Slot>,
    capacity: usize,
    valid: Duration,
    tick: u64,
    /// Lookups that opened the file.
    pub misses: u64,
    /// Lookups that checked the path with `stat`.
    pub revalidations: u64,
}

impl FileCache {
    /// A cache for files under `root` (a canonical directory) holding at most `capacity`
    /// entries (0: every lookup opens the file), each trusted for `valid`.
    pub fn new(root: PathBuf, capacity: usize, valid: Duration) -> Self {
        Self {
            root,
            slots: HashMap::new(),
            capacity,
            valid,
            tick: 0,
            misses: 0,
            revalidations: 0,
        }
    }

    /// The served root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The file a request target names, or the status to answer (400 or 404; see [`resolve`]).
    pub fn get(&mut self, target: &str) -> Result<Arc<CachedFile>, u16> {
        let key = target.split(['?', '#']).next().unwrap_or("");
        self.tick += 1;
        let now = Instant::now();
        if let Some(slot) = self.slots.get_mut(key) {
            if now.duration_since(slot.checked) < self.valid {
                slot.used = self.tick;
                return Ok(slot.f.clone());
            }
            self.revalidations += 1;
            let same = std::fs::metadata(&slot.f.path).is_ok_and(|m| {
                m.is_file()
                    && m.dev() == slot.f.dev
                    && m.ino() == slot.f.ino
                    && m.len() == slot.f.len
                    && (m.mtime(), m.mtime_nsec()) == slot.f.mtime
            });
            if same {
                slot.checked = now;
                slot.used = self.tick;
                return Ok(slot.f.clone());
            }
            self.slots.remove(key);
        }
        self.misses += 1;
        let f = Arc::new(open(&self.root, key)?);
        if self.capacity > 0 {
            if self.slots.len() >= self.capacity {
                let oldest = self
                    .slots
                    .iter()
                    .min_by_key(|(_, s)| s.used)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.slots.remove(&k);
                }
            }
            self.slots.insert(
                key.to_string(),
                Slot {
                    f: f.clone(),
                    checked: now,
                    used: self.tick,
                },
            );
        }
        Ok(f)
    }
}

/// Resolves, opens and (if small) reads one file.
fn open(root: &Path, path: &str) -> Result<CachedFile, u16> {
    let path = resolve(root, path)?;
    let mut file = File::open(&path).map_err(|_| 404u16)?;
    let m = file.metadata().map_err(|_| 404u16)?;
    if !m.is_file() {
        return Err(404);
    }
    let len = m.len();
    let (bytes, file) = if len <= SMALL_FILE {
        let mut v = Vec::with_capacity(len as usize);
        (&mut file)
            .take(len)
            .read_to_end(&mut v)
            .map_err(|_| 404u16)?;
        if v.len() as u64 != len {
            // Shrank while read: the next lookup looks again.
            return Err(404);
        }
        (Some(Arc::from(v)), None)
    } else {
        (None, Some(Arc::new(file)))
    };
    Ok(CachedFile {
        ctype: content_type(&path),
        path,
        len,
        bytes,
        file,
        dev: m.dev(),
        ino: m.ino(),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// Decodes `%XX` escapes; `None` for a bad escape, invalid UTF-8 or an embedded NUL.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.contains('\0')).then_some(s)
}

/// The Content-Type of a file, by its extension.
pub fn content_type(p: &Path) -> &'static str {
    match p.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" | "htm" => "text/html",
        "txt" => "text/plain",
        "css" => "text/css",
        "js" => "application/javascript",
        "json" => "application/json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_the_root_are_refused() {
        let dir = std::env::temp_dir().join(format!("fs-serve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/a.txt"), b"x").unwrap();
        let root = dir.canonicalize().unwrap();
        assert!(resolve(&root, "/sub/a.txt").is_ok());
        assert!(resolve(&root, "/sub/%61.txt").is_ok());
        assert_eq!(resolve(&root, "/../etc/passwd"), Err(400));
        assert_eq!(resolve(&root, "/sub/%2e%2e/%2e%2e/etc/passwd"), Err(400));
        assert_eq!(resolve(&root, "/nope"), Err(404));
        assert_eq!(resolve(&root, "relative"), Err(400));
        assert_eq!(resolve(&root, "/a%00b"), Err(400));
        assert_eq!(resolve(&root, "/a%zz"), Err(400));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn temp_root(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fs-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    #[test]
    fn cache_hits_open_nothing() {
        let root = temp_root("hit");
        std::fs::write(root.join("a.html"), b"hello").unwrap();
        let big = vec![7u8; SMALL_FILE as usize + 1];
        std::fs::write(root.join("big.bin"), &big).unwrap();
        let mut c = FileCache::new(root.clone(), 8, Duration::from_secs(3600));
        let f = c.get("/a.html").unwrap();
        assert_eq!(f.len, 5);
        assert_eq!(f.ctype, "text/html");
        assert_eq!(f.bytes.as_deref(), Some(&b"hello"[..]));
        assert!(f.file.is_none());
        for _ in 0..10 {
            assert_eq!(c.get("/a.html?x=1").unwrap().len, 5);
        }
        let b = c.get("/big.bin").unwrap();
        assert!(b.bytes.is_none() && b.file.is_some());
        assert_eq!(b.len, big.len() as u64);
        c.get("/big.bin").unwrap();
        assert_eq!((c.misses, c.revalidations, c.len()), (2, 0, 2));
        // Escapes are still refused, and errors are not cached.
        assert_eq!(c.get("/../etc/passwd").unwrap_err(), 400);
        assert_eq!(c.get("/nope").unwrap_err(), 404);
        assert_eq!(c.len(), 2);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_replaced_file_is_served_fresh_after_the_window() {
        let root = temp_root("reval");
        std::fs::write(root.join("a.txt"), b"old").unwrap();
        let window = Duration::from_millis(100);
        let mut c = FileCache::new(root.clone(), 8, window);
        assert_eq!(c.get("/a.txt").unwrap().bytes.as_deref(), Some(&b"old"[..]));
        // Replaced as deployments do: a new file renamed over the old one.
        std::fs::write(root.join("a.new"), b"newer").unwrap();
        std::fs::rename(root.join("a.new"), root.join("a.txt")).unwrap();
        // Within the window the cached file still answers, without a look at the disk.
        assert_eq!(c.get("/a.txt").unwrap().len, 3);
        assert_eq!(c.revalidations, 0);
        std::thread::sleep(window + Duration::from_millis(20));
        let f = c.get("/a.txt").unwrap();
        assert_eq!(f.bytes.as_deref(), Some(&b"newer"[..]));
        assert_eq!((c.misses, c.revalidations), (2, 1));
        // Unchanged: the check passes and the entry is kept.
        std::thread::sleep(window + Duration::from_millis(20));
        c.get("/a.txt").unwrap();
        assert_eq!((c.misses, c.revalidations), (2, 2));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_removed_file_is_404_after_the_window() {
        let root = temp_root("gone");
        std::fs::write(root.join("a.txt"), b"x").unwrap();
        let window = Duration::from_millis(100);
        let mut c = FileCache::new(root.clone(), 8, window);
        c.get("/a.txt").unwrap();
        std::fs::remove_file(root.join("a.txt")).unwrap();
        assert!(c.get("/a.txt").is_ok());
        std::thread::sleep(window + Duration::from_millis(20));
        assert_eq!(c.get("/a.txt").unwrap_err(), 404);
        assert!(c.is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
        let root = temp_root("bound");
        for i in 0..5 {
            std::fs::write(root.join(format!("{i}.txt")), b"x").unwrap();
        }
        let mut c = FileCache::new(root.clone(), 2, Duration::from_secs(3600));
        c.get("/0.txt").unwrap();
        c.get("/1.txt").unwrap();
        c.get("/0.txt").unwrap();
        c.get("/2.txt").unwrap(); // evicts 1, the least recently used
        assert_eq!(c.len(), 2);
        let m = c.misses;
        c.get("/0.txt").unwrap();
        assert_eq!(c.misses, m);
        c.get("/1.txt").unwrap();
        assert_eq!(c.misses, m + 1);
        for i in 0..5 {
            c.get(&format!("/{i}.txt")).unwrap();
            assert!(c.len() <= 2);
        }
        // Capacity 0: nothing kept, every lookup opens.
        let mut z = FileCache::new(root.clone(), 0, Duration::from_secs(3600));
        z.get("/0.txt").unwrap();
        z.get("/0.txt").unwrap();
        assert_eq!((z.misses, z.len()), (2, 0));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type(Path::new("a/index.html")), "text/html");
        assert_eq!(content_type(Path::new("x.bin")), "application/octet-stream");
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
    }
}
