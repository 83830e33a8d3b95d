//! Large buffers filled once, at a mount's start (a kept tree's record and tables):
//! asked of the kernel in transparent huge pages, so that filling them takes a page
//! fault every 2 MiB instead of every 4 KiB. On this kind of machine the Linux tree's
//! kept node table (6 MB) decoded in 2.3-4.5 ms in 4 KiB pages and in 1.6-1.8 ms in
//! huge pages (docs/BENCHMARKS.md, "A smaller binary, and a kept record less than half
//! the size"). Where the kernel gives no huge pages (THP `never`, or none free) the
//! advice changes nothing.

/// Bytes of a huge page (x86-64 and arm64 with 4 KiB pages).
const HUGE: usize = 2 << 20;

/// A vector with room for `n` values, its memory advised to be backed by huge pages
/// when it spans one or more.
pub fn bulk_vec<T>(n: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let spare = v.spare_capacity_mut();
    advise_huge(spare.as_mut_ptr().cast(), std::mem::size_of_val(spare));
    v
}

/// Ask for huge pages over the 2 MiB-aligned part of `len` bytes at `ptr`.
fn advise_huge(ptr: *mut u8, len: usize) {
    let (lo, hi) = (ptr as usize, (ptr as usize).saturating_add(len));
    let start = lo.next_multiple_of(HUGE);
    let end = hi & !(HUGE - 1);
    if end > start {
        // SAFETY: advice only, over whole pages inside an allocation this process
        // owns; it changes no byte of it.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large vector is advised (the kernel then reports huge-page advice over part
    /// of it) and holds what is pushed; a small one is left alone.
    #[test]
    fn a_large_vector_asks_for_huge_pages() {
        let mut v: Vec<u64> = bulk_vec(3 * HUGE / 8);
        assert!(v.capacity() >= 3 * HUGE / 8);
        v.extend(0..(3 * HUGE / 8) as u64);
        assert_eq!(v[12345], 12345);
        let start = v.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        // The mapping that holds the vector, and its flags.
        let mut inside = false;
        let mut advised = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = (a..b).contains(&(start + HUGE));
            } else if inside && line.starts_with("VmFlags:") {
                advised |= line.split_whitespace().any(|f| f == "hg");
            }
        }
        assert!(advised, "no mapping with huge-page advice holds the vector");
        let small: Vec<u8> = bulk_vec(4096);
        assert!(small.capacity() >= 4096);
    }
}
