//! Buffers kept for reuse between steps, by device and exact length, and the one rule that
//! makes that safe with CUDA: a buffer is only ever freed inside `take`, on the thread that
//! trains, never where it comes back.
//!
//! A step's flushes mostly have the sizes of the step before, and allocating costs driver calls
//! (a page-locked buffer far more than a step's copy), so the recorder's device hashing keeps its device arenas
//! and page-locked buffers here. They come back (`give_back`) on the trace writer's thread,
//! which has no CUDA context: freeing device memory there fails with
//! `CUDA_ERROR_INVALID_CONTEXT`, which cudarc does not return but stores in the context, so the
//! training thread's next candle call fails with it. That is how recording crashed once a
//! step's hashing needed an arena larger than the pool kept (above about 2 GiB of hashed
//! tensors in one flush). So `give_back` keeps every buffer, and `take` frees what the pool
//! must not keep.
//!
//! Two kinds: `BufferPool`, buffers by exact length (a step's flushes mostly have the sizes of the
//! step before), and `ScratchPool`, one buffer per key as large as its largest use (work whose
//! size varies with each use). Generic over the buffer, so the rule is tested on the CPU.

use std::sync::Mutex;

/// What a pool needs to know of a buffer.
pub(crate) trait Buffer {
    /// Its length in elements (a copy from or into it moves as many as it holds).
    fn len(&self) -> usize;
    /// Its size in bytes.
    fn bytes(&self) -> usize;
}

/// Free buffers by device (`K`) and exact length.
pub(crate) struct BufferPool<K, B> {
    free: Mutex<Vec<(K, B)>>,
    /// Free buffers kept, at most, once a `take` has made room.
    max_count: usize,
    /// Bytes of free buffers kept, at most, once a `take` has made room.
    max_bytes: usize,
}

impl<K: PartialEq, B: Buffer> BufferPool<K, B> {
    pub(crate) const fn new(max_count: usize, max_bytes: usize) -> Self {
        BufferPool { free: Mutex::new(Vec::new()), max_count, max_bytes }
    }

    /// A buffer of exactly `len` elements for key `device`: a free one, or one `allocate`
    /// makes. Call it on the thread that trains: it frees the oldest free buffers of the same
    /// key while the pool holds more than its bounds allow with the new one (only those: a key
    /// can name a thread whose stream may still be using its buffers).
    pub(crate) fn take<E>(&self, device: &K, len: usize, allocate: impl FnOnce() -> Result<B, E>) -> Result<B, E> {
        let mut free = self.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(i) = free.iter().position(|(k, b)| k == device && b.len() == len) {
            return Ok(free.swap_remove(i).1);
        }
        let mut kept: usize = free.iter().map(|(_, b)| b.bytes()).sum();
        let mut evicted = Vec::new();
        while free.len() >= self.max_count || kept.saturating_add(len) > self.max_bytes {
            let Some(oldest) = free.iter().position(|(k, _)| k == device) else { break };
            let (_, buffer) = free.remove(oldest);
            kept -= buffer.bytes();
            evicted.push(buffer);
        }
        drop(free);
        // Freed here, outside the lock, on the calling thread.
        drop(evicted);
        allocate()
    }

    /// Puts a buffer back for reuse once nothing on the device uses it any more. On any
    /// thread: it never frees anything, even a buffer larger than the pool keeps (the next
    /// `take` frees it).
    pub(crate) fn give_back(&self, device: K, buffer: B) {
        let mut free = self.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        free.push((device, buffer));
    }
}

/// One scratch buffer per key (a stream's), kept between uses and as large as the largest use
/// has asked for: for work whose size varies from one use to the next, where a pool of exact
/// lengths would keep a buffer of every size seen.
pub(crate) struct ScratchPool<K, B> {
    kept: Mutex<Vec<(K, B)>>,
}

impl<K: PartialEq, B: Buffer> ScratchPool<K, B> {
    pub(crate) const fn new() -> Self {
        ScratchPool { kept: Mutex::new(Vec::new()) }
    }

    /// `key`'s buffer if it holds at least `len` elements, else the one `allocate` makes; the
    /// smaller one is then freed here, first (call it on the thread that trains: see the
    /// module's documentation).
    pub(crate) fn take<E>(&self, key: &K, len: usize, allocate: impl FnOnce() -> Result<B, E>) -> Result<B, E> {
        let mut kept = self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let old = kept.iter().position(|(k, _)| k == key).map(|i| kept.swap_remove(i).1);
        drop(kept);
        if let Some(buffer) = old {
            if buffer.len() >= len {
                return Ok(buffer);
            }
            drop(buffer);
        }
        allocate()
    }

    /// Keeps `key`'s buffer for its next `take`; never frees anything.
    pub(crate) fn give_back(&self, key: K, buffer: B) {
        self.kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push((key, buffer));
    }
}

/// A length rounded up to its size class (at most an eighth above it, 256 at least), so that
/// requests of slightly different lengths share one pooled buffer.
pub(crate) fn size_class(len: usize) -> usize {
    let len = len.max(256);
    let step = 1usize << (len.ilog2() - 3);
    len.div_ceil(step) * step
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread::ThreadId;

    /// A buffer that notes which thread freed it.
    struct Noted {
        len: usize,
        freed_on: Arc<Mutex<Vec<(usize, ThreadId)>>>,
    }

    impl Buffer for Noted {
        fn len(&self) -> usize {
            self.len
        }
        fn bytes(&self) -> usize {
            self.len
        }
    }

    impl Drop for Noted {
        fn drop(&mut self) {
            self.freed_on.lock().unwrap().push((self.len, std::thread::current().id()));
        }
    }

    fn noted(len: usize, freed_on: &Arc<Mutex<Vec<(usize, ThreadId)>>>) -> Noted {
        Noted { len, freed_on: freed_on.clone() }
    }

    #[test]
    fn a_buffer_larger_than_the_pool_keeps_is_freed_by_the_next_take_not_where_it_comes_back() {
        static POOL: BufferPool<u32, Noted> = BufferPool::new(usize::MAX, 64);
        let freed_on = Arc::new(Mutex::new(Vec::new()));
        let big = noted(1000, &freed_on);
        // Given back on another thread, as the trace writer does.
        std::thread::spawn(move || POOL.give_back(0, big)).join().unwrap();
        assert!(freed_on.lock().unwrap().is_empty(), "give_back freed a buffer");
        // A take of another length makes room: the big one is freed here, on this thread.
        let small = POOL.take(&0, 8, || Ok::<_, ()>(noted(8, &freed_on))).unwrap();
        assert_eq!(*freed_on.lock().unwrap(), vec![(1000, std::thread::current().id())]);
        drop(small);
    }

    #[test]
    fn a_buffer_of_the_same_device_and_length_is_reused_whatever_its_size() {
        let pool: BufferPool<u32, Noted> = BufferPool::new(usize::MAX, 64);
        let freed_on = Arc::new(Mutex::new(Vec::new()));
        pool.give_back(1, noted(1000, &freed_on));
        pool.give_back(0, noted(16, &freed_on));
        let allocated = std::cell::Cell::new(0);
        let take = |device, len| {
            pool.take(&device, len, || {
                allocated.set(allocated.get() + 1);
                Ok::<_, ()>(noted(len, &freed_on))
            })
            .unwrap()
        };
        // An oversized arena of a steady step size is reused, not freed and made again.
        let big = take(1, 1000);
        let small = take(0, 16);
        assert_eq!(allocated.get(), 0);
        assert!(freed_on.lock().unwrap().is_empty());
        // The same length on another device is not a match.
        let other = take(1, 16);
        assert_eq!(allocated.get(), 1);
        drop((big, small, other));
    }

    #[test]
    fn a_scratch_is_reused_while_large_enough_and_replaced_by_a_larger_one_freed_first() {
        let pool: ScratchPool<u32, Noted> = ScratchPool::new();
        let freed_on = Arc::new(Mutex::new(Vec::new()));
        let allocated = std::cell::RefCell::new(Vec::new());
        let take = |key, len| {
            pool.take(&key, len, || {
                // The buffer it replaces is already freed when a larger one is made.
                allocated.borrow_mut().push((len, freed_on.lock().unwrap().len()));
                Ok::<_, ()>(noted(len, &freed_on))
            })
            .unwrap()
        };
        let first = take(0, 100);
        pool.give_back(0, first);
        // Smaller and equal uses take the kept buffer.
        for len in [10, 100] {
            let again = take(0, len);
            assert_eq!(again.len, 100);
            pool.give_back(0, again);
        }
        assert_eq!(*allocated.borrow(), vec![(100, 0)]);
        // Another key has its own.
        let other = take(1, 50);
        assert_eq!(other.len, 50);
        pool.give_back(1, other);
        // A larger use replaces the kept one, freed on this thread before the new one is made.
        let larger = take(0, 400);
        assert_eq!(larger.len, 400);
        assert_eq!(*allocated.borrow(), vec![(100, 0), (50, 0), (400, 1)]);
        assert_eq!(*freed_on.lock().unwrap(), vec![(100, std::thread::current().id())]);
        pool.give_back(0, larger);
        // Given back on another thread, nothing is freed there.
        let moved = take(1, 50);
        std::thread::scope(|s| {
            s.spawn(|| pool.give_back(1, moved));
        });
        assert_eq!(freed_on.lock().unwrap().len(), 1);
    }

    #[test]
    fn size_classes_are_at_most_an_eighth_above_the_length() {
        assert_eq!(size_class(0), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 288);
        assert_eq!(size_class(1 << 30), 1 << 30);
        assert_eq!(size_class((1 << 30) + 1), (1 << 30) + (1 << 27));
        for len in [300usize, 4095, 100_000, 2_700_000_000] {
            let class = size_class(len);
            assert!(class >= len && class - len <= len / 8, "{len} -> {class}");
        }
    }

    #[test]
    fn only_buffers_of_the_same_key_are_freed_to_make_room() {
        let pool: BufferPool<u32, Noted> = BufferPool::new(2, usize::MAX);
        let freed_on = Arc::new(Mutex::new(Vec::new()));
        pool.give_back(1, noted(1, &freed_on));
        pool.give_back(0, noted(2, &freed_on));
        pool.give_back(1, noted(3, &freed_on));
        let four = pool.take(&0, 4, || Ok::<_, ()>(noted(4, &freed_on))).unwrap();
        let freed: Vec<usize> = freed_on.lock().unwrap().iter().map(|(len, _)| *len).collect();
        assert_eq!(freed, vec![2], "key 1's buffers stay, though the pool is over its count");
        drop(four);
    }

    #[test]
    fn the_oldest_free_buffers_go_first_when_the_count_is_full() {
        let pool: BufferPool<u32, Noted> = BufferPool::new(2, usize::MAX);
        let freed_on = Arc::new(Mutex::new(Vec::new()));
        for len in [1, 2, 3] {
            pool.give_back(0, noted(len, &freed_on));
        }
        let four = pool.take(&0, 4, || Ok::<_, ()>(noted(4, &freed_on))).unwrap();
        let freed: Vec<usize> = freed_on.lock().unwrap().iter().map(|(len, _)| *len).collect();
        assert_eq!(freed, vec![1, 2], "room for one more below the count of 2 frees the two oldest");
        // The newest is still there.
        let three = pool.take(&0, 3, || Err(())).unwrap();
        drop((four, three));
    }
}
