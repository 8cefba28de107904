//! One binary, two faces: a CNI plugin when `CNI_COMMAND` is set, a CLI otherwise.
//!
//! The entry point is C's `main`, not std's runtime start: that start reads
//! `/proc/self/maps` and sets up an alternate signal stack for a stack-overflow message,
//! about a dozen system calls that every ADD paid for before its first useful one
//! (docs/EVIDENCE.md, "ADD at the floor"). What of it matters here is done below.
#![cfg_attr(not(test), no_main)]

use cni_ledger::cni::error::{CniError, INTERNAL};

/// Called by the C runtime's start code, with the process's arguments (std still reads
/// them for itself on glibc and musl, so `std::env::args` works unchanged).
#[cfg(not(test))]
// The one entry point of the binary; see the next line's SAFETY.
#[allow(unsafe_code)]
// SAFETY: with `no_main`, nothing else in the program defines the `main` symbol, and
// this signature is the one the C start code calls it with.
#[no_mangle]
pub extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    cni_ledger::process::prepare();
    if std::env::var_os("CNI_COMMAND").is_none() {
        std::process::exit(cni_ledger::cli::main());
    }
    // A panic must still reach the runtime as a CNI error on stdout, not a bare crash.
    let code = std::panic::catch_unwind(cni_ledger::plugin::main).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let err = CniError::new(INTERNAL, "cni-ledger panicked", msg);
        println!("{}", err.to_json(cni_ledger::plugin::error_version()));
        1
    });
    // Flushes stdout (std's exit runs its cleanup) and exits with the code.
    std::process::exit(code);
}

#[cfg(test)]
fn main() {}

#[cfg(test)]
mod tests {
    // Keeps the CniError import used in test builds, where `main` above is not compiled.
    #[test]
    fn error_version_is_known() {
        let _ = super::CniError::new(super::INTERNAL, "x", "y");
        assert!(!cni_ledger::plugin::error_version().is_empty());
    }
}
