//! Maps and sets keyed by small integer identifiers (socket handles, call ids, descriptor
//! numbers) with a cheap hasher.
//!
//! `std`'s default hasher (keyed SipHash-1-3) resists collision attacks on keys an attacker
//! picks, and costs about 20 ns per lookup of a `u32`: under `wrk` it was 2–3% of the CPU of
//! each process using the offload client (its socket, call and interest tables are looked up
//! several times per request). The keys here are chosen by the process itself or handed out
//! by the daemon in sequence, never by a remote peer, so a multiply-and-rotate hash (one
//! multiplication per word, as rustc's own tables use) is enough: the multiplication by an
//! odd constant is a bijection on the low bits, which pick the bucket, and mixes the high
//! bits, which the table compares first.
//!
//! Not for keys another party chooses: for those (the daemon's tables keyed by an
//! application's handles or by placeholder inodes), [`KeyedMap`] hashes with a secret key
//! and a folded multiplication (the full 128-bit product, its halves xored), so the bucket
//! bits depend on every key bit and on the secret: an application cannot aim its handles at
//! one bucket without knowing the key. It costs about what [`IdHasher`] does. Keys a network
//! peer chooses (4-tuples) keep SipHash.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// A map keyed by small integer identifiers chosen locally (see the module docs).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of small integer identifiers chosen locally (see the module docs).
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Multiply-and-rotate hasher for integer keys (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

/// `bytes` as little-endian 64-bit words, the last one zero-padded.
#[inline]
fn words(bytes: &[u8], mut f: impl FnMut(u64)) {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        f(u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        f(u64::from_le_bytes(w));
    }
}

impl IdHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        words(bytes, |w| self.add(w));
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.add(i as u32 as u64);
    }
}

/// A map keyed by values another party picks (an application's handles), hashed with a
/// secret key (see the module docs); make it with [`keyed_map`].
pub type KeyedMap<K, V> = HashMap<K, V, Keys>;

/// A [`KeyedMap`] with the secret key `keys` (the caller draws it at random: this crate
/// touches no source of randomness).
pub fn keyed_map<K, V>(keys: Keys) -> KeyedMap<K, V> {
    HashMap::with_hasher(keys)
}

/// The secret key of a [`KeyedMap`] (the second word is made odd when used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys(pub u64, pub u64);

impl BuildHasher for Keys {
    type Hasher = KeyedHasher;
    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher {
            h: self.0,
            k: self.1 | 1,
        }
    }
}

/// The hasher of [`KeyedMap`]: a folded multiplication by a secret odd key per word.
#[derive(Debug, Clone, Copy)]
pub struct KeyedHasher {
    h: u64,
    k: u64,
}

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let p = (a as u128) * (b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

impl KeyedHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.h = fold_mul(self.h ^ w, self.k);
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // One more round, so the last word is mixed into the low bits too.
        fold_mul(self.h, self.k ^ 0x9e37_79b9_7f4a_7c15).rotate_left(23)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        words(bytes, |w| self.add(w));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(t: T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(t)
    }

    #[test]
    fn sequential_ids_spread_over_buckets_and_top_bits() {
        // The low bits pick the bucket: 1024 sequential ids fill 1024 buckets exactly.
        let low: HashSet<u64> = (0u32..1024).map(|i| h(i) & 1023).collect();
        assert_eq!(low.len(), 1024);
        // The top 7 bits are the table's tag: sequential ids must not share one.
        let top: HashSet<u64> = (0u32..1024).map(|i| h(i) >> 57).collect();
        assert!(top.len() > 100, "only {} distinct tags", top.len());
    }

    #[test]
    fn keyed_hashes_spread_keys_aimed_at_one_bucket() {
        // Handles that share their low 20 bits: a plain multiplication maps them all to one
        // bucket of any table up to 2^20; the folded product with a key must not.
        let keys = Keys(0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3211);
        let aimed: Vec<u32> = (1u32..=1024).map(|i| i << 20).collect();
        let plain: HashSet<u64> = aimed.iter().map(|&x| h(x) & 1023).collect();
        assert_eq!(
            plain.len(),
            1,
            "the unkeyed hasher is aimable (why KeyedMap exists)"
        );
        let keyed: HashSet<u64> = aimed.iter().map(|&x| keys.hash_one(x) & 1023).collect();
        assert!(keyed.len() > 500, "only {} buckets used", keyed.len());
        // Another key, other buckets.
        let other = Keys(keys.0 ^ 1, keys.1 ^ 2);
        assert_ne!(keys.hash_one(7u32), other.hash_one(7u32));
        let mut m: KeyedMap<u32, u32> = keyed_map(keys);
        for &x in &aimed {
            m.insert(x, x / 2);
        }
        assert!(aimed.iter().all(|x| m[x] == x / 2));
    }

    #[test]
    fn maps_work_with_every_key_shape_used() {
        let mut m: IdMap<u32, u32> = IdMap::default();
        let mut s: IdSet<(u64, u64)> = IdSet::default();
        let mut fds: IdMap<i32, ()> = IdMap::default();
        for i in 0..10_000u32 {
            m.insert(i, i * 2);
            s.insert((i as u64, !(i as u64)));
            fds.insert(-(i as i32), ());
        }
        assert!((0..10_000u32).all(|i| m[&i] == i * 2));
        assert!(s.contains(&(7, !7)) && !s.contains(&(7, 7)));
        assert_eq!(fds.len(), 10_000);
        assert_ne!(h([1u8, 2, 3].as_slice()), h([1u8, 2, 4].as_slice()));
    }
}
