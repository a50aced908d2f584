//! Placeholders across exec: the exec wrappers list the descriptors that survive (no
//! `FD_CLOEXEC`) in `FLOWSTACK_FDS=fd:entry,…`; the new program's shim adopts those the daemon
//! confirms are its placeholders when the library is loaded.

use crate::state::{self, inside};
use crate::table::Entry;

/// An entry as it travels in `FLOWSTACK_FDS`.
pub fn encode(e: &Entry) -> String {
    format!("{:x}", e.to_bits())
}

/// Parses `FLOWSTACK_FDS`; malformed items are skipped.
pub fn parse(v: &str) -> Vec<(i32, Entry)> {
    v.split(',')
        .filter_map(|item| {
            let (fd, bits) = item.split_once(':')?;
            let fd = fd.parse::<i32>().ok().filter(|&fd| fd >= 0)?;
            let e = Entry::from_bits(u64::from_str_radix(bits, 16).ok()?)?;
            Some((fd, e))
        })
        .collect()
}

/// Adopts the inherited placeholders (called once when the library is loaded).
pub fn adopt_inherited() {
    let Ok(v) = std::env::var("FLOWSTACK_FDS") else {
        return;
    };
    let items = parse(&v);
    if items.is_empty() {
        return;
    }
    let st = state::state();
    let Ok(b) = st.backend() else { return };
    for (fd, e) in items {
        if let Some(id) = inside(|| b.adopt(fd)) {
            let e = Entry { id, ..e };
            if st.table.set(fd, e) {
                st.hold(id);
                st.note_flowstack(fd, "inherited");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_the_environment() {
        let mut e = Entry::new(42, true, false, true);
        e.listening = true;
        let v = format!(
            "5:{},bad,7:zz,-1:1,9:{}",
            encode(&e),
            encode(&Entry::new(1, false, true, false))
        );
        let got = parse(&v);
        assert_eq!(got.len(), 2, "malformed items skipped: {got:?}");
        assert_eq!(got[0], (5, e));
        assert_eq!(got[1].0, 9);
        assert!(got[1].1.dgram);
        assert!(parse("").is_empty());
        assert!(parse("3:0").is_empty(), "a zero word is no entry");
    }
}
