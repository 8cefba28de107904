//! Bounded parallelism that degrades instead of panicking: where the system refuses a
//! thread (systemd `TasksMax`, `ulimit -u`), the work runs on the calling thread.

/// Runs `work` on up to `jobs` scoped threads and returns what each returned.
pub fn run<T: Send>(jobs: usize, work: impl Fn() -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for _ in 0..jobs.max(1) {
            match std::thread::Builder::new().spawn_scoped(s, &work) {
                Ok(h) => handles.push(h),
                Err(e) => {
                    crate::warn!("cannot start a worker thread ({e}); going on with fewer");
                    break;
                }
            }
        }
        let mut out: Vec<T> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        if out.is_empty() {
            out.push(work());
        }
        out
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_worker_reports() {
        let n = std::sync::atomic::AtomicUsize::new(0);
        let out = super::run(3, || n.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
        assert_eq!(out.len(), 3);
        assert_eq!(n.into_inner(), 3);
    }
}
