//! The counter namespace lives in `flowstack-api` (one home for every layer's names); TCP
//! re-exports it so `flowstack_tcp::counters::Counter` keeps working.
pub use flowstack_api::counters::*;
