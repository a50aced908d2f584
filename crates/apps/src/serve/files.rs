//! Request paths to files under the served root, and their content types.

use std::path::{Component, Path, PathBuf};

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

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type(Path::new("a/index.html")), "text/html");
        assert_eq!(content_type(Path::new("x.bin")), "application/octet-stream");
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
    }
}
