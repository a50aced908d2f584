//! TCP sequence numbers with wrap-aware comparison (RFC 9293 §3.4).

use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, AddAssign, Sub};

/// A 32-bit TCP sequence number. Comparisons are modulo 2^32: `a < b` means `b` is ahead of `a`
/// by less than 2^31. Never compare the raw `u32`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNum(pub u32);

impl SeqNum {
    /// Signed distance from `other` to `self` (positive if `self` is ahead).
    #[inline]
    pub fn diff(self, other: SeqNum) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }
    /// Returns the later of the two.
    #[inline]
    pub fn max(self, other: SeqNum) -> SeqNum {
        if self.diff(other) >= 0 {
            self
        } else {
            other
        }
    }
    /// Returns the earlier of the two.
    #[inline]
    pub fn min(self, other: SeqNum) -> SeqNum {
        if self.diff(other) <= 0 {
            self
        } else {
            other
        }
    }
    /// True if `lo <= self < hi` in sequence space.
    #[inline]
    pub fn in_range(self, lo: SeqNum, hi: SeqNum) -> bool {
        self.0.wrapping_sub(lo.0) < hi.0.wrapping_sub(lo.0)
    }
}

impl PartialOrd for SeqNum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl Add<usize> for SeqNum {
    type Output = SeqNum;
    #[inline]
    fn add(self, n: usize) -> SeqNum {
        debug_assert!(n <= i32::MAX as usize, "sequence advance too large");
        SeqNum(self.0.wrapping_add(n as u32))
    }
}

impl AddAssign<usize> for SeqNum {
    #[inline]
    fn add_assign(&mut self, n: usize) {
        *self = *self + n;
    }
}

impl Sub<usize> for SeqNum {
    type Output = SeqNum;
    #[inline]
    fn sub(self, n: usize) -> SeqNum {
        SeqNum(self.0.wrapping_sub(n as u32))
    }
}

impl Sub<SeqNum> for SeqNum {
    type Output = usize;
    /// Distance from `rhs` forward to `self`; saturates to zero if `rhs` is ahead.
    #[inline]
    fn sub(self, rhs: SeqNum) -> usize {
        let d = self.diff(rhs);
        if d < 0 {
            0
        } else {
            d as usize
        }
    }
}

impl fmt::Display for SeqNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_wrap() {
        let a = SeqNum(u32::MAX - 5);
        let b = a + 10;
        assert!(a < b);
        assert!(b > a);
        assert_eq!(b - a, 10);
        assert_eq!(a - b, 0);
        assert!(SeqNum(3).in_range(a, b));
        assert!(!b.in_range(a, b));
        assert_eq!(a.max(b), b);
        assert_eq!(a.min(b), a);
    }
}
