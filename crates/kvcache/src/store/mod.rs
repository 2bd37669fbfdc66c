// SPDX-License-Identifier: Apache-2.0
//! The KV store of a private namespace: sequences, pages, the DRAM group buffer, the journal.
//!
//! On the media the region is: a superblock page, a journal of `J` pages in two halves, then
//! data pages. Appends fill a DRAM group buffer per head and write whole pages as they
//! fill, then one journal record saying which pages now belong to which head; a restarted
//! store replays the journal and so finds every flushed page (tokens still in DRAM are
//! lost). When the active half fills, the live state is written to the other half as a
//! checkpoint and the superblock, rewritten last, switches halves.

mod journal;

use crate::{Dtype, HeadPages, Kind, KvError, Layout, Loaded};
use insitu_media::{AlignedBuf, Backing, ReadPurpose};
use journal::{Journal, Record};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// A sequence's shape and progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqInfo {
    /// Sequence id (chosen by the host).
    pub seq: u64,
    /// Layers.
    pub layers: usize,
    /// KV heads kept on this target.
    pub kv_heads: usize,
    /// Page layout of every head.
    pub layout: Layout,
    /// Tokens stored, per layer.
    pub tokens: Vec<usize>,
}

impl SeqInfo {
    /// The info result the KV_ADMIN info command returns for this sequence.
    pub fn wire_info(&self) -> insitu_proto::attention::Info {
        insitu_proto::attention::Info {
            layers: self.layers,
            kv_heads: self.kv_heads,
            head_dim: self.layout.head_dim,
            dtype: self.layout.dtype,
            dims_per_page: self.layout.dims_per_page,
            page_bytes: self.layout.page_bytes,
            tokens: self.tokens.clone(),
        }
    }
}

/// Space in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreUsage {
    /// Flash page size.
    pub page_bytes: usize,
    /// Data pages in the namespace.
    pub pages_total: u64,
    /// Data pages free.
    pub pages_free: u64,
    /// Live sequences.
    pub sequences: usize,
    /// Live sequences that are kept ([`Lifetime::Kept`]); the others have an owner.
    pub kept: usize,
    /// Sequences freed because their owner ended ([`KvCache::free_owned`]) or because the
    /// store reopened while they had one, since it opened.
    pub reclaimed: u64,
}

/// A holder of sequences freed together when it ends: on a target, the controller (the
/// host's association) that created them. Made by [`KvCache::new_owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(u64);

/// How long a sequence lives.
///
/// A host's KV cache is scratch space of one inference: when the host goes (killed, its
/// link cut), nobody will free what it created, and a pool of drives would fill with
/// orphans. So a sequence belongs to an owner unless it is asked to be kept (a shared
/// prompt's prefix, forked by many hosts, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Until freed: past its creator's end and the store's reopening.
    Kept,
    /// Until freed or its owner ends ([`KvCache::free_owned`]), and never past a reopening
    /// (the owner is gone then, and with it the tokens still in DRAM).
    Owned(Owner),
}

/// One (layer, head) of a sequence.
#[derive(Clone)]
struct Head {
    tokens: usize,
    k_pages: Vec<u32>,
    v_pages: Vec<u32>,
    /// Per dimension group, one page per full block of `tokens_per_dim_page` tokens.
    d_pages: Vec<Vec<u32>>,
    /// Rows (f32, token-major) not yet filling a token page.
    k_tail: Arc<Vec<f32>>,
    v_tail: Arc<Vec<f32>>,
    /// K's values (f32) of the tokens not yet filling a dimension block, one run per
    /// dimension: SparF's first step reads a few dimensions over every token, and a
    /// sequence split over targets can hold its whole share here (with 4 targets, 512 of
    /// 2,048 tokens, where a dimension page holds 2,048 f16 tokens), so each of its
    /// dimensions is one contiguous run rather than an element of every token's row.
    d_tail: Arc<Vec<Vec<f32>>>,
    v_sum: Vec<f64>,
}

impl Head {
    fn new(l: &Layout) -> Head {
        Head {
            tokens: 0,
            k_pages: Vec::new(),
            v_pages: Vec::new(),
            d_pages: vec![Vec::new(); l.dim_groups()],
            k_tail: Arc::default(),
            v_tail: Arc::default(),
            d_tail: Arc::new(vec![Vec::new(); l.head_dim]),
            v_sum: vec![0.0; l.head_dim],
        }
    }

    /// The flushed pages and the DRAM tail of K or V.
    fn rows(&self, kind: Kind) -> (&[u32], &[f32]) {
        match kind {
            Kind::K => (&self.k_pages, &self.k_tail),
            Kind::V => (&self.v_pages, &self.v_tail),
        }
    }

    fn pages(&self) -> impl Iterator<Item = u32> + '_ {
        self.k_pages.iter().chain(&self.v_pages).chain(self.d_pages.iter().flatten()).copied()
    }
}

#[derive(Clone)]
struct Seq {
    layers: usize,
    kv_heads: usize,
    layout: Layout,
    /// Layer-major. Shared with the views attention reads through (a view is a reference
    /// count, not a copy of the page lists); an append copies a head a view still holds.
    heads: Vec<Arc<Head>>,
    lifetime: Lifetime,
}

impl Seq {
    /// A sequence of `layers` × `kv_heads` empty heads.
    fn new(layers: usize, kv_heads: usize, layout: Layout) -> Seq {
        Seq { layers, kv_heads, layout, heads: (0..layers * kv_heads).map(|_| Arc::new(Head::new(&layout))).collect(), lifetime: Lifetime::Kept }
    }

    fn info(&self, seq: u64) -> SeqInfo {
        let tokens = (0..self.layers).map(|l| self.heads[l * self.kv_heads].tokens).collect();
        SeqInfo { seq, layers: self.layers, kv_heads: self.kv_heads, layout: self.layout, tokens }
    }
}

/// Free pages are kept in [`STRIPE`] classes by the number of the drive page holding them
/// (the flash page, which may hold several KV pages) modulo `STRIPE`. A drive stripes
/// consecutive flash pages over its dies, so a head whose next page comes from the class
/// after its last one has its pages spread over every die (for any die count dividing
/// `STRIPE`), and one head's read is served by all channels at once (InstInfer IV-C).
///
/// Each new list starts [`LIST_START_STEP`] classes after the list before it. Sparse
/// attention reads some pages of every list more than others (the first, the most recent);
/// if every list began on the same channel, those pages would all queue on a few channels
/// while the others idle. Staggered starts spread them over all channels as evenly as dense
/// reads are.
const STRIPE: usize = 64;

/// How far apart consecutive lists start, in classes: odd, so that the starts still visit
/// every class (and every channel of any power-of-two count) in turn. A head's K list and
/// V list are made one after the other and SparF reads K page `g` with V page `g`, often
/// beside pages `g ± 1`: one class apart, V page `g` and K page `g + 1` would share a
/// channel; three apart, a run of up to three chosen pages puts its K and V pages on
/// different channels (custom:25, 4 targets, 4 × 1,024: the step's wait on the modelled
/// drive 0.172–0.182 s against 0.183–0.193 s, five runs each).
const LIST_START_STEP: usize = 3;

struct State {
    seqs: HashMap<u64, Seq>,
    refs: Vec<u32>,
    /// Per class, free pages in descending order (the lowest is popped first).
    free: Vec<Vec<u32>>,
    free_count: u64,
    /// The class the next new list starts from.
    next_start: usize,
    /// The drive page of data page 0 and KV pages per drive page: a page's class.
    first_unit: u64,
    per_unit: u64,
    journal: Journal,
    /// The last owner handed out.
    owners: u64,
    /// See [`StoreUsage::reclaimed`].
    reclaimed: u64,
}

impl State {
    /// Makes `records` durable, after the data pages they name. A full journal half is
    /// replaced by a checkpoint of the state (which already includes nothing of `records`).
    fn log(&mut self, records: Vec<Record>) -> Result<(), KvError> {
        if self.journal.append(&records)? {
            return Ok(());
        }
        let mut all = checkpoint(&self.seqs);
        all.extend(records);
        self.journal.rewrite(&all)
    }

    /// Frees the sequences `ids` (each one live): journaled, then their pages released
    /// where no fork still holds them.
    fn free_seqs(&mut self, ids: &[u64]) -> Result<(), KvError> {
        self.log(ids.iter().map(|&seq| Record::Free { seq }).collect())?;
        for id in ids {
            let s = self.seqs.remove(id).expect("live");
            self.release(s.heads.iter().flat_map(|h| h.pages().collect::<Vec<_>>()));
        }
        self.sort_free();
        Ok(())
    }

    fn free_pages(&self) -> u64 {
        self.free_count
    }

    /// The class of data page `p`: its drive page modulo [`STRIPE`].
    fn class(&self, p: u32) -> usize {
        ((self.first_unit + u64::from(p)) / self.per_unit % STRIPE as u64) as usize
    }

    /// A free page for a list whose last page is `after`: from the class after it, or for a
    /// new list from the class after the last new list's; else from the next class with a
    /// free page.
    fn alloc(&mut self, after: Option<u32>) -> u32 {
        let want = match after {
            Some(p) => (self.class(p) + 1) % STRIPE,
            None => {
                self.next_start = (self.next_start + LIST_START_STEP) % STRIPE;
                self.next_start
            }
        };
        let class = (0..STRIPE).map(|i| (want + i) % STRIPE).find(|c| !self.free[*c].is_empty()).expect("space was checked before allocating");
        let p = self.free[class].pop().expect("class is not empty");
        self.free_count -= 1;
        self.refs[p as usize] = 1;
        p
    }

    fn release(&mut self, pages: impl Iterator<Item = u32>) {
        for p in pages {
            let r = &mut self.refs[p as usize];
            *r -= 1;
            if *r == 0 {
                let class = self.class(p);
                self.free[class].push(p);
                self.free_count += 1;
            }
        }
    }

    fn sort_free(&mut self) {
        self.free.iter_mut().for_each(|c| c.sort_unstable_by(|a, b| b.cmp(a)));
    }
}

thread_local! {
    /// Each attention thread's buffer for page reads, kept between reads: a fresh one per
    /// read cost an allocation and the zeroing of every byte the read then overwrites.
    static READ_BUF: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::new(0));
}

/// The most a thread keeps of [`READ_BUF`] (larger reads, a long head read densely, get a
/// buffer of their own): each of the attention threads (one to four per core) keeps at most this.
const READ_BUF_KEPT: usize = 2 << 20;

/// The KV cache kept in one private namespace.
pub struct KvCache {
    media: Arc<Backing>,
    page_bytes: usize,
    /// Byte offset of data page 0.
    data_base: u64,
    data_pages: u32,
    state: Mutex<State>,
    /// Threads the attention of a command's heads runs on (see [`KvCache::attend_all`]).
    workers: rayon::ThreadPool,
}

/// Attention threads per core on a drive. A request's threads do not sleep on the drive
/// model (its reads are booked on a [`Timeline`] and waited for once), but the real reads
/// still block them: with one per core a 8 x 2,048-token SparF step took 15% longer on 2
/// cores. Small requests never wake them (see [`KvCache::map_heads`]), so their idle
/// spinning costs little. Media in memory is read through a map, which blocks nothing, so
/// there one thread per core computes as much and switches less (the same step's attention
/// took 0.095-0.117 s with one per core against 0.112-0.119 s with four, alternating).
const ATTENTION_THREADS_PER_CORE: usize = 4;

/// Work (tokens times query elements, over a request's heads) from which a request's heads
/// are shared among the attention threads: about a millisecond of a core's arithmetic.
const SHARED_WORK: usize = 1 << 20;

/// A read view of one (sequence, layer, head), steady while it lives.
pub struct HeadView {
    media: Arc<Backing>,
    data_base: u64,
    layout: Layout,
    head: Arc<Head>,
    /// The request this view reads for, when it waits for its reads at its end rather
    /// than read by read (see [`Timeline`]).
    timeline: Option<Arc<Timeline>>,
    /// When this view's last reads arrive on the modelled drive: its next reads depend on
    /// them (SparF reads the pages its dimension pages point at), so they are issued then.
    ready: Mutex<Option<Instant>>,
}

/// The modelled drive's time for the reads of one request.
///
/// Its views book their reads without waiting ([`Backing::read_batch_deferred`]), each
/// after its own previous reads, and the request waits once, until the last of them has
/// arrived ([`Timeline::wait`]): so the request takes the longer of its real and its
/// modelled time, the engine's compute overlaps the drive as a drive's engine overlaps
/// it, and the attention threads never sleep on the drive, so a few keep every read of
/// every request in flight.
#[derive(Default)]
pub(crate) struct Timeline {
    last: Mutex<Option<Instant>>,
}

impl Timeline {
    fn note(&self, ready: Instant) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        *last = Some(last.map_or(ready, |t| t.max(ready)));
    }

    /// Waits until every read booked so far has arrived on `media`'s timing model, and
    /// returns how long that took: the time the request waited on the drive once its
    /// engine had finished (0 when nothing was read on a model, or all had arrived).
    pub(crate) fn wait(&self, media: &Backing) -> u64 {
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(t) = last else { return 0 };
        let now = Instant::now();
        media.wait_until(t);
        u64::try_from(t.saturating_duration_since(now).as_nanos()).unwrap_or(u64::MAX)
    }
}

fn bad(m: impl Into<String>) -> KvError {
    KvError::BadRequest(m.into())
}

impl KvCache {
    /// Opens the store in `len` bytes at `base` of `media` with KV pages of `page_bytes`:
    /// recovers the sequences a previous run left (every flushed page), or formats an empty
    /// store when the region holds none. The drive's flash pages are taken to be KV pages;
    /// see [`KvCache::open_on_drive`].
    pub fn open(media: Arc<Backing>, base: u64, len: u64, page_bytes: usize) -> Result<KvCache, KvError> {
        KvCache::open_on_drive(media, base, len, page_bytes, page_bytes)
    }

    /// [`KvCache::open`] on a drive whose flash pages (its striping unit) are
    /// `flash_page_bytes`, a multiple of `page_bytes`: a head's consecutive KV pages are
    /// placed on consecutive flash pages, so that they fall on different dies.
    pub fn open_on_drive(media: Arc<Backing>, base: u64, len: u64, page_bytes: usize, flash_page_bytes: usize) -> Result<KvCache, KvError> {
        if page_bytes < 512 || !page_bytes.is_power_of_two() {
            return Err(bad(format!("page size {page_bytes} is not a power of two of at least 512")));
        }
        if flash_page_bytes < page_bytes || !flash_page_bytes.is_multiple_of(page_bytes) {
            return Err(bad(format!("a {flash_page_bytes}-byte flash page does not hold whole {page_bytes}-byte KV pages")));
        }
        let total = len / page_bytes as u64;
        if total < 8 {
            return Err(bad(format!("a {len}-byte private namespace is too small for a KV store of {page_bytes}-byte pages")));
        }
        let journal_pages = (total / 32).max(4) & !1;
        let data_pages = u32::try_from(total - 1 - journal_pages).map_err(|_| bad("private namespace too large for 32-bit page numbers"))?;
        let journal = Journal::open(media.clone(), base, page_bytes, journal_pages as usize)?;
        let data_base = base + (1 + journal_pages) * page_bytes as u64;
        let mut state = State {
            seqs: HashMap::new(),
            refs: vec![0; data_pages as usize],
            free: vec![Vec::new(); STRIPE],
            free_count: 0,
            next_start: STRIPE - 1,
            first_unit: data_base / page_bytes as u64,
            per_unit: (flash_page_bytes / page_bytes) as u64,
            journal,
            owners: 0,
            reclaimed: 0,
        };
        let records = state.journal.replay()?;
        for r in records {
            apply(&mut state.seqs, r, page_bytes)?;
        }
        // Owned sequences outlive no reopening: their owners are gone.
        // (No pages to release yet: `recover` counts references from what stays.)
        let orphans: Vec<u64> = state.seqs.iter().filter(|(_, s)| s.lifetime != Lifetime::Kept).map(|(id, _)| *id).collect();
        if !orphans.is_empty() {
            orphans.iter().for_each(|id| drop(state.seqs.remove(id)));
            state.reclaimed = orphans.len() as u64;
            state.log(orphans.into_iter().map(|seq| Record::Free { seq }).collect())?;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per_core = if media.is_in_memory() { 1 } else { ATTENTION_THREADS_PER_CORE };
        let workers = rayon::ThreadPoolBuilder::new()
            .num_threads(cores * per_core)
            .thread_name(|i| format!("kv-attend-{i}"))
            // One CPU each (SPDK pins its reactors the same way): idle pool threads yield
            // for a while before they sleep, and two yielding on one CPU stay there, so a
            // request's heads then ran on one core while the other stood idle (a fifth to a
            // quarter of the decode steps' exchanges, at twice the time).
            .start_handler(pin_to_cpu)
            .build()
            .map_err(|e| KvError::Io(std::io::Error::other(format!("cannot start the attention threads: {e}"))))?;
        let store = KvCache { media, page_bytes, data_base, data_pages, state: Mutex::new(state), workers };
        store.recover()?;
        Ok(store)
    }

    /// [`crate::attend_all`] on this store's attention threads, or on the calling thread
    /// when the tasks are small (see [`KvCache::map_heads`]).
    pub fn attend_all(&self, tasks: Vec<crate::Task<'_>>, scale: f32, method: crate::Method) -> Result<crate::AttendStats, KvError> {
        let work = tasks.iter().map(|t| t.head.tokens() * t.q.len()).sum();
        crate::attention::sum_stats(self.map_heads(tasks, work, |t| crate::attention::attend_task(t, scale, method)))
    }

    /// Maps `f` over a request's (entry, KV head) `items`, in order: on this store's
    /// attention threads when the request's `work` (tokens times query elements over its
    /// heads) is worth sharing among cores, else on the calling thread, where a decode
    /// step's small parts of split sequences cost less than handing them over and back.
    pub(crate) fn map_heads<T: Send, R: Send>(&self, items: Vec<T>, work: usize, f: impl Fn(T) -> R + Sync + Send) -> Vec<R> {
        if work < SHARED_WORK || self.workers.current_num_threads() < 2 {
            return items.into_iter().map(f).collect();
        }
        self.workers.install(|| items.into_par_iter().map(f).collect())
    }

    /// After replay: keep what whole pages hold, rebuild the DRAM tails and sums of V from
    /// the media, count references and list free pages.
    fn recover(&self) -> Result<(), KvError> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut refs = vec![0u32; self.data_pages as usize];
        let ids: Vec<u64> = st.seqs.keys().copied().collect();
        for id in ids {
            let mut seq = st.seqs.remove(&id).expect("listed");
            let l = seq.layout;
            for layer in 0..seq.layers {
                let heads = &mut seq.heads[layer * seq.kv_heads..(layer + 1) * seq.kv_heads];
                let whole = heads.iter().map(|h| h.k_pages.len().min(h.v_pages.len())).min().unwrap_or(0);
                let tokens = whole * l.tokens_per_page;
                let blocks = tokens / l.tokens_per_dim_page;
                for h in heads.iter_mut().map(Arc::make_mut) {
                    h.k_pages.truncate(whole);
                    h.v_pages.truncate(whole);
                    h.d_pages.iter_mut().for_each(|d| d.truncate(blocks));
                    if h.d_pages.iter().any(|d| d.len() < blocks) {
                        return Err(KvError::Io(std::io::Error::other(format!("journal of sequence {id} lacks dimension pages"))));
                    }
                    h.tokens = tokens;
                    let view = HeadView::new(self.media.clone(), self.data_base, l, Arc::new(h.clone()), None);
                    let mut rows = vec![0f32; l.tokens_per_page * l.head_dim];
                    let mut d_tail = vec![Vec::new(); l.head_dim];
                    h.v_sum = vec![0.0; l.head_dim];
                    for g in 0..whole {
                        view.load_token_group(Kind::V, g, &mut rows)?;
                        for r in rows.chunks_exact(l.head_dim) {
                            h.v_sum.iter_mut().zip(r).for_each(|(s, x)| *s += f64::from(*x));
                        }
                        if (g + 1) * l.tokens_per_page > blocks * l.tokens_per_dim_page {
                            view.load_token_group(Kind::K, g, &mut rows)?;
                            let first = (blocks * l.tokens_per_dim_page).saturating_sub(g * l.tokens_per_page);
                            append_by_dimension(&mut d_tail, &rows[first * l.head_dim..]);
                        }
                    }
                    h.d_tail = Arc::new(d_tail);
                    h.k_tail = Arc::default();
                    h.v_tail = Arc::default();
                    for p in h.pages() {
                        refs.get_mut(p as usize)
                            .map(|r| *r += 1)
                            .ok_or_else(|| KvError::Io(std::io::Error::other(format!("journal names page {p} beyond the store"))))?;
                    }
                }
            }
            st.seqs.insert(id, seq);
        }
        for p in (0..self.data_pages).filter(|p| refs[*p as usize] == 0) {
            let class = st.class(p);
            st.free[class].push(p);
            st.free_count += 1;
        }
        st.refs = refs;
        st.sort_free();
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates sequence `seq` with `layers` layers of `kv_heads` heads of `head_dim`, kept
    /// until freed.
    pub fn create(&self, seq: u64, layers: usize, kv_heads: usize, head_dim: usize, dtype: Dtype, dims_per_page: usize) -> Result<SeqInfo, KvError> {
        self.create_as(Lifetime::Kept, seq, layers, kv_heads, head_dim, dtype, dims_per_page)
    }

    /// [`KvCache::create`], living as long as `lifetime` says.
    #[allow(clippy::too_many_arguments)] // the shape's fields, as the wire request has them
    pub fn create_as(
        &self,
        lifetime: Lifetime,
        seq: u64,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        dtype: Dtype,
        dims_per_page: usize,
    ) -> Result<SeqInfo, KvError> {
        if layers == 0 || layers > 1024 || kv_heads == 0 || kv_heads > 1024 {
            return Err(bad(format!("{layers} layers x {kv_heads} KV heads: each must be in 1..=1024")));
        }
        let layout = Layout::new(head_dim, dtype, self.page_bytes, dims_per_page)?;
        let mut st = self.lock();
        if st.seqs.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let rec = Record::Create {
            seq,
            layers: layers as u16,
            kv_heads: kv_heads as u16,
            head_dim: head_dim as u16,
            dtype: dtype.code(),
            dims_per_page: dims_per_page as u8,
        };
        st.log(with_lifetime(rec, seq, lifetime))?;
        let mut s = Seq::new(layers, kv_heads, layout);
        s.lifetime = lifetime;
        let info = s.info(seq);
        st.seqs.insert(seq, s);
        Ok(info)
    }

    /// Creates `child` sharing every token of `parent` (its full pages by reference), kept
    /// until freed.
    pub fn fork(&self, parent: u64, child: u64) -> Result<SeqInfo, KvError> {
        self.fork_as(Lifetime::Kept, parent, child)
    }

    /// [`KvCache::fork`], the child living as long as `lifetime` says (whatever the
    /// parent's).
    pub fn fork_as(&self, lifetime: Lifetime, parent: u64, child: u64) -> Result<SeqInfo, KvError> {
        let mut st = self.lock();
        let mut p = st.seqs.get(&parent).ok_or(KvError::UnknownSequence(parent))?.clone();
        if st.seqs.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        st.log(with_lifetime(Record::Fork { parent, child }, child, lifetime))?;
        for page in p.heads.iter().flat_map(|h| h.pages()) {
            st.refs[page as usize] += 1;
        }
        p.lifetime = lifetime;
        let info = p.info(child);
        st.seqs.insert(child, p);
        Ok(info)
    }

    /// A new owner, whose sequences [`KvCache::free_owned`] frees together.
    pub fn new_owner(&self) -> Owner {
        let mut st = self.lock();
        st.owners += 1;
        Owner(st.owners)
    }

    /// Frees every sequence `owner` holds (its pages return once no fork uses them) and
    /// returns how many.
    pub fn free_owned(&self, owner: Owner) -> Result<usize, KvError> {
        let mut st = self.lock();
        let ids: Vec<u64> = st.seqs.iter().filter(|(_, s)| s.lifetime == Lifetime::Owned(owner)).map(|(id, _)| *id).collect();
        if ids.is_empty() {
            return Ok(0);
        }
        st.free_seqs(&ids)?;
        st.reclaimed += ids.len() as u64;
        Ok(ids.len())
    }

    /// Frees a sequence; its pages return to the free list once no fork uses them.
    pub fn free(&self, seq: u64) -> Result<(), KvError> {
        let mut st = self.lock();
        if !st.seqs.contains_key(&seq) {
            return Err(KvError::UnknownSequence(seq));
        }
        st.free_seqs(&[seq])
    }

    /// A sequence's shape and progress.
    pub fn info(&self, seq: u64) -> Result<SeqInfo, KvError> {
        self.lock().seqs.get(&seq).map(|s| s.info(seq)).ok_or(KvError::UnknownSequence(seq))
    }

    /// Space in the store.
    pub fn usage(&self) -> StoreUsage {
        let st = self.lock();
        StoreUsage {
            page_bytes: self.page_bytes,
            pages_total: u64::from(self.data_pages),
            pages_free: st.free_pages(),
            sequences: st.seqs.len(),
            kept: st.seqs.values().filter(|s| s.lifetime == Lifetime::Kept).count(),
            reclaimed: st.reclaimed,
        }
    }

    /// Appends `tokens` tokens to `layer` of `seq`: `k` and `v` are f32,
    /// `[kv_heads][tokens][head_dim]`. Returns the layer's new token count.
    pub fn append(&self, seq: u64, layer: usize, tokens: usize, k: &[f32], v: &[f32]) -> Result<usize, KvError> {
        let mut st = self.lock();
        let s = st.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let (l, heads) = (s.layout, s.kv_heads);
        if layer >= s.layers {
            return Err(KvError::Mismatch { seq, what: format!("layer {layer} does not exist (the sequence has {} layers)", s.layers) });
        }
        if tokens == 0 || tokens > 1 << 20 || k.len() != heads * tokens * l.head_dim || v.len() != k.len() {
            return Err(KvError::Mismatch {
                seq,
                what: format!("an append of {tokens} tokens needs {} values each of K and V, got {} and {}", heads * tokens * l.head_dim, k.len(), v.len()),
            });
        }
        let before = s.heads[layer * heads].tokens;
        let after = before + tokens;
        let new_tok = after / l.tokens_per_page - before / l.tokens_per_page;
        let new_blk = after / l.tokens_per_dim_page - before / l.tokens_per_dim_page;
        let needed = (heads * (2 * new_tok + new_blk * l.dim_groups())) as u64;
        if needed > st.free_pages() {
            return Err(KvError::Full { needed, free: st.free_pages() });
        }
        let mut s = st.seqs.remove(&seq).expect("checked");
        let mut records = Vec::new();
        let result = (|| {
            for h in 0..heads {
                let rows = h * tokens * l.head_dim..(h + 1) * tokens * l.head_dim;
                let head = Arc::make_mut(&mut s.heads[layer * heads + h]);
                let (kr, vr) = (&k[rows.clone()], &v[rows]);
                for r in vr.chunks_exact(l.head_dim) {
                    head.v_sum.iter_mut().zip(r).for_each(|(a, x)| *a += f64::from(*x));
                }
                let first = (head.k_pages.len(), head.d_pages[0].len());
                self.fill(&mut st, &mut head.k_pages, Arc::make_mut(&mut head.k_tail), kr, &l)?;
                self.fill(&mut st, &mut head.v_pages, Arc::make_mut(&mut head.v_tail), vr, &l)?;
                self.fill_dims(&mut st, &mut head.d_pages, Arc::make_mut(&mut head.d_tail).as_mut_slice(), kr, &l)?;
                head.tokens = after;
                let at = |pages: &[u32], from: usize| pages[from..].to_vec();
                for (kind, pages, from) in [(0u8, &head.k_pages, first.0), (1, &head.v_pages, first.0)] {
                    if pages.len() > from {
                        records.push(Record::Pages { seq, layer: layer as u16, head: h as u16, kind, first: from as u32, pages: at(pages, from) });
                    }
                }
                for (g, d) in head.d_pages.iter().enumerate() {
                    if d.len() > first.1 {
                        records.push(Record::Pages {
                            seq,
                            layer: layer as u16,
                            head: h as u16,
                            kind: 2 + g as u8,
                            first: first.1 as u32,
                            pages: at(d, first.1),
                        });
                    }
                }
            }
            Ok::<(), KvError>(())
        })();
        st.seqs.insert(seq, s);
        result?;
        if !records.is_empty() {
            st.log(records)?;
        }
        Ok(after)
    }

    /// Appends rows to a token-indexed tail and writes each page it fills.
    fn fill(&self, st: &mut State, pages: &mut Vec<u32>, tail: &mut Vec<f32>, rows: &[f32], l: &Layout) -> Result<(), KvError> {
        let per_page = l.tokens_per_page * l.head_dim;
        for r in rows.chunks(per_page) {
            let room = per_page - tail.len();
            let (now, rest) = r.split_at(room.min(r.len()));
            tail.extend_from_slice(now);
            if tail.len() == per_page {
                let p = st.alloc(pages.last().copied());
                self.write_page(p, tail, l.dtype)?;
                pages.push(p);
                tail.clear();
                tail.extend_from_slice(rest);
            }
        }
        Ok(())
    }

    /// Appends K rows to the dimension-indexed tail and writes each block it fills: one page
    /// per dimension group, dimension-major inside the page.
    fn fill_dims(&self, st: &mut State, pages: &mut [Vec<u32>], tail: &mut [Vec<f32>], rows: &[f32], l: &Layout) -> Result<(), KvError> {
        let tpd = l.tokens_per_dim_page;
        // Made when a block fills (a decode step's token fills one in thousands).
        let mut page = Vec::new();
        let mut rows = rows;
        while !rows.is_empty() {
            let room = tpd - tail[0].len();
            let (now, rest) = rows.split_at((room * l.head_dim).min(rows.len()));
            append_by_dimension(tail, now);
            rows = rest;
            if tail[0].len() == tpd {
                page.resize(tpd * l.dims_per_page, 0.0);
                for (g, list) in pages.iter_mut().enumerate() {
                    for (j, run) in page.chunks_exact_mut(tpd).enumerate() {
                        run.copy_from_slice(&tail[g * l.dims_per_page + j]);
                    }
                    let p = st.alloc(list.last().copied());
                    self.write_page(p, &page, l.dtype)?;
                    list.push(p);
                }
                tail.iter_mut().for_each(Vec::clear);
            }
        }
        Ok(())
    }

    fn write_page(&self, page: u32, values: &[f32], dtype: Dtype) -> Result<(), KvError> {
        let bytes: Vec<u8> = match dtype {
            Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Dtype::F16 => values.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        };
        debug_assert_eq!(bytes.len(), self.page_bytes);
        self.media.write_at(&bytes, self.data_base + u64::from(page) * self.page_bytes as u64)?;
        Ok(())
    }

    /// A read view of one head of one layer; each of its loads waits for its reads.
    pub fn head(&self, seq: u64, layer: usize, head: usize) -> Result<HeadView, KvError> {
        self.head_on(seq, layer, head, None)
    }

    /// [`KvCache::head`] whose reads are booked on `timeline`, when given, and not waited
    /// for: the caller waits on the timeline before it answers.
    pub(crate) fn head_on(&self, seq: u64, layer: usize, head: usize, timeline: Option<&Arc<Timeline>>) -> Result<HeadView, KvError> {
        let st = self.lock();
        let s = st.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))?;
        if layer >= s.layers || head >= s.kv_heads {
            return Err(KvError::Mismatch { seq, what: format!("layer {layer} head {head} is outside {} layers x {} heads", s.layers, s.kv_heads) });
        }
        Ok(HeadView::new(self.media.clone(), self.data_base, s.layout, s.heads[layer * s.kv_heads + head].clone(), timeline.cloned()))
    }

    /// The media the store lives on.
    pub(crate) fn media(&self) -> &Backing {
        &self.media
    }
}

/// The records of a sequence `seq` made by `made`, living as `lifetime` says.
fn with_lifetime(made: Record, seq: u64, lifetime: Lifetime) -> Vec<Record> {
    match lifetime {
        Lifetime::Kept => vec![made],
        Lifetime::Owned(_) => vec![made, Record::Owned { seq }],
    }
}

/// Records that rebuild `seqs` from nothing.
fn checkpoint(seqs: &HashMap<u64, Seq>) -> Vec<Record> {
    let mut out = Vec::new();
    for (id, s) in seqs {
        let l = s.layout;
        out.push(Record::Create {
            seq: *id,
            layers: s.layers as u16,
            kv_heads: s.kv_heads as u16,
            head_dim: l.head_dim as u16,
            dtype: l.dtype.code(),
            dims_per_page: l.dims_per_page as u8,
        });
        if s.lifetime != Lifetime::Kept {
            out.push(Record::Owned { seq: *id });
        }
        for (i, h) in s.heads.iter().enumerate() {
            let (layer, head) = ((i / s.kv_heads) as u16, (i % s.kv_heads) as u16);
            let lists = [(0u8, &h.k_pages), (1, &h.v_pages)].into_iter().chain(h.d_pages.iter().enumerate().map(|(g, d)| (2 + g as u8, d)));
            for (kind, pages) in lists {
                if !pages.is_empty() {
                    out.push(Record::Pages { seq: *id, layer, head, kind, first: 0, pages: pages.clone() });
                }
            }
        }
    }
    out
}

/// Replays one journal record onto the sequences.
fn apply(seqs: &mut HashMap<u64, Seq>, r: Record, page_bytes: usize) -> Result<(), KvError> {
    let corrupt = |m: String| KvError::Io(std::io::Error::other(format!("KV journal: {m}")));
    match r {
        Record::Create { seq, layers, kv_heads, head_dim, dtype, dims_per_page } => {
            let layout = Layout::new(usize::from(head_dim), Dtype::from_code(dtype)?, page_bytes, usize::from(dims_per_page))?;
            let (layers, kv_heads) = (usize::from(layers), usize::from(kv_heads));
            seqs.insert(seq, Seq::new(layers, kv_heads, layout));
        }
        Record::Fork { parent, child } => {
            let mut p = seqs.get(&parent).ok_or_else(|| corrupt(format!("fork of unknown sequence {parent}")))?.clone();
            p.lifetime = Lifetime::Kept; // unless an Owned record follows
            seqs.insert(child, p);
        }
        Record::Free { seq } => {
            seqs.remove(&seq);
        }
        Record::Owned { seq } => {
            // Which owner does not outlive the run that wrote it; that there was one does.
            seqs.get_mut(&seq).ok_or_else(|| corrupt(format!("owner of unknown sequence {seq}")))?.lifetime = Lifetime::Owned(Owner(0));
        }
        Record::Pages { seq, layer, head, kind, first, pages } => {
            let s = seqs.get_mut(&seq).ok_or_else(|| corrupt(format!("pages of unknown sequence {seq}")))?;
            let i = usize::from(layer) * s.kv_heads + usize::from(head);
            let h = Arc::make_mut(s.heads.get_mut(i).ok_or_else(|| corrupt(format!("layer {layer} head {head} outside sequence {seq}")))?);
            let list = match kind {
                0 => &mut h.k_pages,
                1 => &mut h.v_pages,
                g => h.d_pages.get_mut(usize::from(g - 2)).ok_or_else(|| corrupt(format!("dimension group {} outside sequence {seq}", g - 2)))?,
            };
            list.truncate(first as usize);
            if list.len() != first as usize {
                return Err(corrupt(format!("pages of sequence {seq} start at {first} after {} pages", list.len())));
            }
            list.extend(pages);
        }
    }
    Ok(())
}

/// Most pages one read of adjacent pages covers.
const PAGES_PER_READ: usize = 256;

impl HeadView {
    fn new(media: Arc<Backing>, data_base: u64, layout: Layout, head: Arc<Head>, timeline: Option<Arc<Timeline>>) -> HeadView {
        HeadView { media, data_base, layout, head, timeline, ready: Mutex::new(None) }
    }

    /// Reads `spans` into `buf`: at once, booked on the view's timeline after its previous
    /// reads, or waiting for them when the view has no timeline.
    fn read_spans<'b>(&'b self, spans: &[(u64, usize)], buf: &'b mut AlignedBuf) -> Result<Vec<&'b [u8]>, KvError> {
        let Some(timeline) = &self.timeline else {
            return Ok(self.media.read_batch_for(spans, buf, ReadPurpose::Offload)?);
        };
        let mut ready = self.ready.lock().unwrap_or_else(PoisonError::into_inner);
        let (read, done) = self.media.read_batch_deferred(spans, buf, ReadPurpose::Offload, *ready)?;
        if let Some(done) = done {
            timeline.note(done);
            *ready = Some(done);
        }
        Ok(read)
    }

    /// Reads `pages` (each `(at, page)`: flash page `page` decoded into `out[at..][..per]`)
    /// as one batch: every page is on the drive's queue at once, and adjacent pages bound for
    /// adjacent places are one read.
    fn read_pages(&self, pages: &[(usize, u32)], out: &mut [f32], per: usize) -> Result<Loaded, KvError> {
        if pages.is_empty() {
            return Ok(Loaded::default());
        }
        let pb = self.layout.page_bytes;
        let mut runs: Vec<(usize, u32, usize)> = Vec::new(); // (first place, first page, pages)
        for &(at, page) in pages {
            match runs.last_mut() {
                Some((a, p, n)) if *n < PAGES_PER_READ && at == *a + *n * per && u64::from(page) == u64::from(*p) + *n as u64 => *n += 1,
                _ => runs.push((at, page, 1)),
            }
        }
        let spans: Vec<(u64, usize)> = runs.iter().map(|&(_, p, n)| (self.data_base + u64::from(p) * pb as u64, n * pb)).collect();
        let need = spans.iter().map(|s| s.1).sum::<usize>() + 2 * insitu_media::DIRECT_ALIGN * spans.len();
        let mut fill = |buf: &mut AlignedBuf| -> Result<Loaded, KvError> {
            let read = self.read_spans(&spans, buf)?;
            for (i, (&(at, _, n), bytes)) in runs.iter().zip(&read).enumerate() {
                if let Some(next) = read.get(i + 1) {
                    prefetch(next);
                }
                decode(self.layout.dtype, bytes, &mut out[at..at + n * per]);
            }
            Ok(Loaded { pages: pages.len() as u64, bytes: (pages.len() * pb) as u64 })
        };
        if need > READ_BUF_KEPT {
            return fill(&mut AlignedBuf::new(need));
        }
        READ_BUF.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < need {
                // Grown to what the reads ask, not to the most kept: a target has a
                // thread per queue slot (eight per queue and connection), and zeroing 2 MiB
                // on each one's first read took a tenth of a 4-target SparF step's CPU.
                *buf = AlignedBuf::new(need.next_power_of_two().min(READ_BUF_KEPT));
            }
            fill(&mut buf)
        })
    }

    /// Token groups `groups` of each of `kinds`, one batch of reads: kind `kinds[j]`'s group
    /// `groups[i]` goes to row `(j * groups.len() + i) * tokens_per_page` of `out`.
    fn load_groups(&self, kinds: &[Kind], groups: &[usize], out: &mut [f32]) -> Result<(Vec<usize>, Loaded), KvError> {
        let (d, tpp) = (self.layout.head_dim, self.layout.tokens_per_page);
        let per = tpp * d;
        let held = self.head.k_pages.len(); // K and V fill pages together
        if self.head.v_pages.len() != held {
            return Err(KvError::invalid_data(format!("the head holds {held} K pages and {} V pages", self.head.v_pages.len())));
        }
        let tail_rows = self.head.k_tail.len() / d;
        let mut rows = Vec::with_capacity(groups.len());
        for &g in groups {
            if g < held {
                rows.push(tpp);
            } else if g == held && tail_rows > 0 {
                rows.push(tail_rows);
            } else {
                return Err(bad(format!("token group {g} is beyond the {} tokens held", self.head.tokens)));
            }
        }
        let slots = kinds.len() * groups.len();
        if out.len() < slots.saturating_sub(1) * per + rows.last().map_or(0, |r| r * d) {
            return Err(bad(format!("a buffer of {} elements for {} token groups", out.len(), slots)));
        }
        let mut on_flash = Vec::with_capacity(slots);
        for (j, &kind) in kinds.iter().enumerate() {
            let (pages, _) = self.head.rows(kind);
            on_flash.extend(groups.iter().enumerate().filter(|(_, &g)| g < held).map(|(i, &g)| ((j * groups.len() + i) * per, pages[g])));
        }
        let loaded = self.read_pages(&on_flash, out, per)?;
        if let Some(i) = groups.iter().position(|&g| g == held) {
            for (j, &kind) in kinds.iter().enumerate() {
                let (_, tail) = self.head.rows(kind);
                out[(j * groups.len() + i) * per..][..tail.len()].copy_from_slice(tail);
            }
        }
        Ok((rows, loaded))
    }
}

/// Appends token-major `rows` (whole rows of `tail.len()` elements) to the runs of `tail`,
/// one per dimension.
fn append_by_dimension(tail: &mut [Vec<f32>], rows: &[f32]) {
    for row in rows.chunks_exact(tail.len()) {
        tail.iter_mut().zip(row).for_each(|(run, &x)| run.push(x));
    }
}

/// Asks the CPU to bring `bytes` into its caches, a line at a time, without waiting.
///
/// A run of pages read from a store in memory is a few KiB at an address of its own; the
/// hardware prefetcher stops at each 4 KiB boundary, so decoding run after run waits on
/// memory at the start of every one. Fetching the next run while this one decodes hides
/// that wait.
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint: it reads nothing into the program and cannot fault.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Little-endian elements of `dtype` in `bytes` into `out`, as f32.
pub(crate) fn decode(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::F32 => bytes.chunks_exact(4).zip(out.iter_mut()).for_each(|(c, o)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::F16 => {
            use half::slice::HalfFloatSliceExt;
            let n = (bytes.len() / 2).min(out.len());
            // Pages arrive in aligned buffers, so on a little-endian host they are f16 values
            // as they lie: one conversion with the CPU's f16 instructions, no copy first.
            if let (true, Ok(h)) = (cfg!(target_endian = "little"), bytemuck::try_cast_slice::<u8, half::f16>(&bytes[..2 * n])) {
                widen_f16(h, &mut out[..n]);
                return;
            }
            let mut h = [half::f16::ZERO; 256];
            for (c, o) in bytes[..2 * n].chunks(2 * h.len()).zip(out[..n].chunks_mut(h.len())) {
                let m = c.len() / 2;
                h[..m].iter_mut().zip(c.chunks_exact(2)).for_each(|(x, b)| *x = half::f16::from_le_bytes([b[0], b[1]]));
                h[..m].convert_to_f32_slice(&mut o[..m]);
            }
        }
    }
}

/// Pins the calling thread to the `i`-th CPU (modulo their count) of those it may run on;
/// leaves it as it is when the mask cannot be read or set.
fn pin_to_cpu(i: usize) {
    // SAFETY: cpu_set_t is plain data; the calls get and set the calling thread's mask.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return;
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
        if cpus.is_empty() {
            return;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[i % cpus.len()], &mut one);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
    }
}

/// `out[i] = h[i]` as f32 (exact: every f16 is an f32), for `h` and `out` of one length.
///
/// A page's conversion is the engine's widest loop after the attention kernels: the `half`
/// crate's slice conversion checks the CPU and calls out for every eight elements, so on
/// x86-64 this loop is compiled with F16C and AVX, eight elements an instruction, inlined.
fn widen_f16(h: &[half::f16], out: &mut [f32]) {
    assert_eq!(h.len(), out.len(), "one f32 for each f16");
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx,f16c")]
        unsafe fn f16c(h: &[half::f16], out: &mut [f32]) {
            use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
            let mut hs = h.chunks_exact(8);
            let mut os = out.chunks_exact_mut(8);
            for (x, o) in (&mut hs).zip(&mut os) {
                // SAFETY: eight f16 (16 bytes) are read and eight f32 (32 bytes) written, each
                // inside its chunk; both intrinsics take unaligned addresses.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().cast::<__m128i>()))) };
            }
            hs.remainder().iter().zip(os.into_remainder()).for_each(|(x, o)| *o = x.to_f32());
        }
        if std::is_x86_feature_detected!("f16c") && std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has both features, checked just above.
            return unsafe { f16c(h, out) };
        }
    }
    use half::slice::HalfFloatSliceExt;
    h.convert_to_f32_slice(out);
}

impl HeadPages for HeadView {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn tokens(&self) -> usize {
        self.head.tokens
    }

    fn load_token_group(&self, kind: Kind, group: usize, out: &mut [f32]) -> Result<(usize, Loaded), KvError> {
        let (rows, loaded) = self.load_token_groups(kind, &[group], out)?;
        Ok((rows[0], loaded))
    }

    fn load_token_groups(&self, kind: Kind, groups: &[usize], out: &mut [f32]) -> Result<(Vec<usize>, Loaded), KvError> {
        self.load_groups(&[kind], groups, out)
    }

    fn load_token_groups_kv(&self, groups: &[usize], out: &mut [f32]) -> Result<(Vec<usize>, Loaded), KvError> {
        self.load_groups(&[Kind::K, Kind::V], groups, out)
    }

    fn load_dim_group(&self, group: usize, out: &mut [f32]) -> Result<Loaded, KvError> {
        self.load_dim_groups(&[group], out)
    }

    fn load_dim_groups(&self, groups: &[usize], out: &mut [f32]) -> Result<Loaded, KvError> {
        let l = &self.layout;
        let (s, tpd, dpp) = (self.head.tokens, l.tokens_per_dim_page, l.dims_per_page);
        let mut lists = Vec::with_capacity(groups.len());
        for &g in groups {
            lists.push(self.head.d_pages.get(g).ok_or_else(|| bad(format!("dimension group {g} is outside the head")))?);
        }
        if out.len() < groups.len() * dpp * s {
            return Err(bad(format!("a buffer of {} elements for {} dimension groups of {s} tokens", out.len(), groups.len())));
        }
        let per = tpd * dpp;
        let loaded = if dpp == 1 {
            // A page holds one dimension's run of tokens, so it is decoded in place.
            let places: Vec<(usize, u32)> =
                lists.iter().enumerate().flat_map(|(i, p)| p.iter().enumerate().map(move |(b, &page)| (i * s + b * tpd, page))).collect();
            self.read_pages(&places, out, per)?
        } else {
            // Every page of every group, one batch: page b of group i in slot i * blocks + b,
            // then each of its dimensions' runs moved to its row.
            let blocks = lists.iter().map(|p| p.len()).max().unwrap_or(0);
            let places: Vec<(usize, u32)> =
                lists.iter().enumerate().flat_map(|(i, p)| p.iter().enumerate().map(move |(b, &page)| ((i * blocks + b) * per, page))).collect();
            let mut pages = vec![0f32; groups.len() * blocks * per];
            let loaded = self.read_pages(&places, &mut pages, per)?;
            for (i, list) in lists.iter().enumerate() {
                let out = &mut out[i * dpp * s..(i + 1) * dpp * s];
                for (b, page) in pages[i * blocks * per..].chunks_exact(per).take(list.len()).enumerate() {
                    for j in 0..dpp {
                        out[j * s + b * tpd..j * s + (b + 1) * tpd].copy_from_slice(&page[j * tpd..(j + 1) * tpd]);
                    }
                }
            }
            loaded
        };
        // Each dimension's tail is one run, after its pages' tokens.
        for (i, (&g, list)) in groups.iter().zip(&lists).enumerate() {
            for j in 0..dpp {
                let run = &self.head.d_tail[g * dpp + j];
                let at = (i * dpp + j) * s + list.len() * tpd;
                out[at..at + run.len()].copy_from_slice(run);
            }
        }
        Ok(loaded)
    }

    fn v_sum(&self) -> Vec<f64> {
        self.head.v_sum.clone()
    }
}

#[cfg(test)]
mod tests;
