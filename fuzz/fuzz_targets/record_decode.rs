//! Record files are read back from disk after crashes, bit rot and tampering:
//! `ledger::record::decode` must classify any bytes without panicking, and a record it
//! accepts must re-encode to bytes that decode to the same record.
#![no_main]

use cni_ledger::ledger::record::{decode, encode, Decoded};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match decode(data) {
        Decoded::Ok(rec) => {
            let again = encode(&rec);
            match decode(&again) {
                Decoded::Ok(r2) => assert_eq!(*r2, *rec, "re-encoded record differs"),
                other => panic!("re-encoded record does not decode: {other:?}"),
            }
            let _ = rec.key().stem();
            let _ = rec.created_unix();
            if let Some(gc) = &rec.gc {
                if let Some(t) = &gc.next_attempt_at {
                    let _ = cni_ledger::time::parse_rfc3339(t);
                }
            }
        }
        Decoded::Damaged(d) => assert!(!d.reason.as_str().is_empty()),
        Decoded::Newer(v) => assert!(v > cni_ledger::ledger::record::FORMAT),
        // Only a scan that could not read a file says so; bytes in hand always decode
        // to one of the above.
        Decoded::Unreadable(e) => panic!("bytes decoded as a read error: {e}"),
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = cni_ledger::time::parse_rfc3339(s);
    }
});
