//! Leaf module: an index-linked slab, the structure behind the queue, the
//! running set and the parked workers.
//!
//! Entries live in one `Vec`; each is addressed by a [`Key`] (its index)
//! that its owner keeps, and belongs to at most one intrusive doubly linked
//! [`List`] at a time. So every operation the pool needs is O(1): append,
//! take the front or the back, and unlink an entry *at any position* by its
//! key (a cancel in the middle of a million queued jobs costs what a cancel
//! at the front costs). Freed entries are chained for reuse; when the slab
//! empties it gives its memory back (beyond a few entries), so a burst
//! does not pin its peak.
//!
//! # Invariants
//!
//! 1. An occupied entry is in exactly one list or in none (`prev`/`next`
//!    are `NIL` then); a vacant entry is in the free chain.
//! 2. A list's `len` is the number of entries linked into it.

/// The index of an entry. `u32` keeps an entry at 24 bytes next to a fat
/// `Arc`; the pool bounds its configuration so keys never run out.
pub(crate) type Key = u32;

const NIL: Key = Key::MAX;

/// An emptied slab of at most this many entries keeps them allocated.
const KEEP_EMPTY: usize = 16;

struct Entry<T> {
    value: Option<T>,
    prev: Key,
    next: Key,
}

/// A slab of `T` with O(1) insert, remove and list operations.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    /// Head of the chain of vacant entries (linked through `next`).
    free: Key,
    len: usize,
}

/// An intrusive list of slab entries: just its ends and length.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct List {
    head: Option<Key>,
    tail: Option<Key>,
    len: usize,
}

impl List {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key at the front, if any.
    pub(crate) fn front(&self) -> Option<Key> {
        self.head
    }
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            free: NIL,
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` (in no list yet) and returns its key.
    ///
    /// The caller bounds how many entries exist: fewer than `u32::MAX` (one
    /// key, `NIL`, is reserved). The pool's configuration bounds guarantee
    /// it (config.rs).
    pub(crate) fn insert(&mut self, value: T) -> Key {
        self.len += 1;
        if self.free != NIL {
            let key = self.free;
            let e = &mut self.entries[key as usize];
            self.free = e.next;
            *e = Entry {
                value: Some(value),
                prev: NIL,
                next: NIL,
            };
            return key;
        }
        let key = self.entries.len() as Key;
        self.entries.push(Entry {
            value: Some(value),
            prev: NIL,
            next: NIL,
        });
        key
    }

    /// Removes the entry `key`, which must be in no list, and returns its
    /// value. When the slab becomes empty its memory is released.
    pub(crate) fn remove(&mut self, key: Key) -> Option<T> {
        let e = self.entries.get_mut(key as usize)?;
        debug_assert!(e.prev == NIL && e.next == NIL, "remove a linked entry");
        let value = e.value.take()?;
        e.next = self.free;
        self.free = key;
        self.len -= 1;
        if self.len == 0 {
            // Amortised O(1): paid for by the inserts that filled it. A
            // small slab keeps its memory: a pool running one job at a time
            // would otherwise allocate and free it for every job.
            if self.entries.capacity() > KEEP_EMPTY {
                self.entries = Vec::new();
            } else {
                self.entries.clear();
            }
            self.free = NIL;
        }
        Some(value)
    }

    /// The value at `key`, if occupied.
    pub(crate) fn get(&self, key: Key) -> Option<&T> {
        self.entries.get(key as usize)?.value.as_ref()
    }

    /// Whether no entry is occupied.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many entries it has, occupied or vacant.
    pub(crate) fn slots(&self) -> usize {
        self.entries.len()
    }

    /// How many entries are occupied.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every occupied value, in key order (O(entries): for small slabs).
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.entries.iter().filter_map(|e| e.value.as_ref())
    }

    /// The keys of every occupied entry, in key order (O(entries)).
    pub(crate) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.entries.len())
            .filter(|&i| self.entries[i].value.is_some())
            .map(|i| i as Key)
    }

    /// The value at `key`, if occupied, for changing.
    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut T> {
        self.entries.get_mut(key as usize)?.value.as_mut()
    }

    /// Appends the entry `key` (in no list) to `list`.
    pub(crate) fn push_back(&mut self, list: &mut List, key: Key) {
        let old_tail = list.tail;
        {
            let e = &mut self.entries[key as usize];
            e.prev = old_tail.unwrap_or(NIL);
            e.next = NIL;
        }
        match old_tail {
            Some(t) => self.entries[t as usize].next = key,
            None => list.head = Some(key),
        }
        list.tail = Some(key);
        list.len += 1;
    }

    /// Links the entry `key` (in no list) at the front of `list`.
    pub(crate) fn push_front(&mut self, list: &mut List, key: Key) {
        let old_head = list.head;
        {
            let e = &mut self.entries[key as usize];
            e.prev = NIL;
            e.next = old_head.unwrap_or(NIL);
        }
        match old_head {
            Some(h) => self.entries[h as usize].prev = key,
            None => list.tail = Some(key),
        }
        list.head = Some(key);
        list.len += 1;
    }

    /// Unlinks the entry `key`, which must be in `list`.
    pub(crate) fn unlink(&mut self, list: &mut List, key: Key) {
        let (prev, next) = {
            let e = &mut self.entries[key as usize];
            let links = (e.prev, e.next);
            e.prev = NIL;
            e.next = NIL;
            links
        };
        if prev == NIL {
            list.head = (next != NIL).then_some(next);
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            list.tail = (prev != NIL).then_some(prev);
        } else {
            self.entries[next as usize].prev = prev;
        }
        list.len -= 1;
    }

    /// Unlinks and returns the key at the front of `list`.
    pub(crate) fn pop_front(&mut self, list: &mut List) -> Option<Key> {
        let key = list.head?;
        self.unlink(list, key);
        Some(key)
    }

    /// Unlinks and returns the key at the back of `list`.
    pub(crate) fn pop_back(&mut self, list: &mut List) -> Option<Key> {
        let key = list.tail?;
        self.unlink(list, key);
        Some(key)
    }

    /// The values of `list`, front to back.
    pub(crate) fn iter<'a>(&'a self, list: &List) -> impl Iterator<Item = &'a T> + 'a {
        let mut at = list.head.unwrap_or(NIL);
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let e = &self.entries[at as usize];
            at = e.next;
            e.value.as_ref()
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn order(slab: &Slab<u32>, list: &List) -> Vec<u32> {
        slab.iter(list).copied().collect()
    }

    #[test]
    fn lists_keep_order_through_removals_anywhere() {
        let mut slab = Slab::default();
        let mut a = List::default();
        let keys: Vec<Key> = (0..6).map(|v| slab.insert(v)).collect();
        for &k in &keys {
            slab.push_back(&mut a, k);
        }
        slab.unlink(&mut a, keys[3]); // middle
        slab.unlink(&mut a, keys[0]); // front
        slab.unlink(&mut a, keys[5]); // back
        assert_eq!(order(&slab, &a), vec![1, 2, 4]);
        assert_eq!(a.len(), 3);
        assert_eq!(slab.remove(keys[3]), Some(3));
        let k = slab.insert(9); // reuses a freed entry
        assert_eq!(k, keys[3]);
        slab.push_back(&mut a, k);
        assert_eq!(order(&slab, &a), vec![1, 2, 4, 9]);
        assert_eq!(slab.pop_front(&mut a), Some(keys[1]));
        assert_eq!(slab.pop_back(&mut a), Some(k));
        assert_eq!(order(&slab, &a), vec![2, 4]);
        assert_eq!(slab.get(keys[2]), Some(&2));
    }

    #[test]
    fn two_lists_share_one_slab_and_an_emptied_large_slab_frees_its_memory() {
        let mut slab = Slab::default();
        let (mut a, mut b) = (List::default(), List::default());
        let x = slab.insert(1);
        let y = slab.insert(2);
        slab.push_back(&mut a, x);
        slab.push_back(&mut b, y);
        slab.unlink(&mut a, x);
        slab.push_back(&mut b, x);
        assert!(a.is_empty());
        assert_eq!(order(&slab, &b), vec![2, 1]);
        while let Some(k) = slab.pop_front(&mut b) {
            slab.remove(k);
        }
        // A small slab keeps its few entries' memory, and starts over.
        assert!(slab.entries.is_empty());
        assert!(slab.entries.capacity() <= KEEP_EMPTY);
        assert_eq!(slab.get(x), None);
        assert_eq!(slab.remove(x), None);
        assert_eq!(slab.insert(3), 0, "an emptied slab hands out key 0");
        slab.remove(0);
        // A large one gives its memory back.
        let keys: Vec<Key> = (0..=KEEP_EMPTY as u32).map(|i| slab.insert(i)).collect();
        assert!(slab.entries.capacity() > KEEP_EMPTY);
        for k in keys {
            slab.remove(k);
        }
        assert_eq!(slab.entries.capacity(), 0);
    }
}
