//! One binary, two faces: a CNI plugin when `CNI_COMMAND` is set, a CLI otherwise.

use cni_ledger::cni::error::{CniError, INTERNAL};

fn main() {
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
    std::process::exit(code);
}
