//! Locks that outlive a panic.
//!
//! A panic while a lock is held poisons it; every later `lock()` then fails. In pkgfs a
//! panic is caught where it happens (a request answers `EIO`, a loop logs and goes on),
//! and the data behind every lock stays consistent across one (counters, caches, maps
//! whose updates are single operations), so the right answer to poisoning is to carry
//! on: these helpers take the guard whatever happened. One place for it instead of a
//! helper in every module.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `m`, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-lock `l`, poisoned or not.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-lock `l`, poisoned or not.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// Wait on `c` with `guard`, poisoned or not.
pub fn wait<'a, T>(c: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    c.wait(guard).unwrap_or_else(|e| e.into_inner())
}

/// Wait on `c` with `guard` for `limit` at most, poisoned or not; true if it timed out.
pub fn wait_timeout<'a, T>(
    c: &Condvar,
    guard: MutexGuard<'a, T>,
    limit: std::time::Duration,
) -> (MutexGuard<'a, T>, bool) {
    let (g, t) = c
        .wait_timeout(guard, limit)
        .unwrap_or_else(|e| e.into_inner());
    (g, t.timed_out())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let m = Mutex::new(1);
        let l = RwLock::new(2);
        let _ = std::panic::catch_unwind(|| {
            let _g = m.lock().unwrap();
            let _w = l.write().unwrap();
            panic!("poison");
        });
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        *write(&l) += 1;
        assert_eq!(*read(&l), 3);
    }
}
