//! The handles the daemon gives to accepted connections.

/// The handle for a newly accepted connection: the first free one from `next` in the
/// accepted range `[ACCEPTED_BASE, POSIX_BASE)`, wrapping at its end, so a long-lived
/// server that accepted more connections than the range holds reuses the numbers of closed
/// ones instead of overwriting a live one. (The application learns the handle from the
/// completion, so the daemon may choose any free number.) An application cannot hold the
/// whole range: its socket limit is far below it.
pub(crate) fn accepted_handle(next: u32, in_use: impl Fn(u32) -> bool) -> u32 {
    use flowstack_api::region::{ACCEPTED_BASE, POSIX_BASE};
    let span = POSIX_BASE - ACCEPTED_BASE;
    let start = if (ACCEPTED_BASE..POSIX_BASE).contains(&next) {
        next - ACCEPTED_BASE
    } else {
        0
    };
    (0..span)
        .map(|i| ACCEPTED_BASE + (start + i) % span)
        .find(|&h| !in_use(h))
        .unwrap_or(ACCEPTED_BASE)
}

#[cfg(test)]
mod tests {
    use super::accepted_handle;
    use flowstack_api::region::{ACCEPTED_BASE, POSIX_BASE};

    #[test]
    fn accepted_handles_wrap_and_skip_live_ones() {
        let none = |_| false;
        assert_eq!(accepted_handle(ACCEPTED_BASE, none), ACCEPTED_BASE);
        assert_eq!(accepted_handle(ACCEPTED_BASE + 7, none), ACCEPTED_BASE + 7);
        // The end of the range wraps to its start instead of repeating its last number.
        assert_eq!(accepted_handle(POSIX_BASE - 1, none), POSIX_BASE - 1);
        assert_eq!(accepted_handle(POSIX_BASE, none), ACCEPTED_BASE);
        // Live handles are skipped, across the wrap too.
        let live = |h| h == POSIX_BASE - 1 || h == ACCEPTED_BASE;
        assert_eq!(accepted_handle(POSIX_BASE - 1, live), ACCEPTED_BASE + 1);
    }
}
