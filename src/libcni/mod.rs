//! What the ledger reads from libcni's own state: its result cache
//! (`<cacheDir>/results/…`, [`cache`]) and the records adopted from it ([`adopt`]) for
//! attachments made before the ledger was in the chain. gc, `adopt` and the agent use it.

pub mod adopt;
pub mod cache;
