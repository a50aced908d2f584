//! The header of an application's shared region: defined once in `flowstack-api`.
pub use flowstack_api::region::*;
