// SPDX-License-Identifier: Apache-2.0
//! Crash consistency: power is cut after a random number of device writes (anywhere in
//! an operation or a commit), then only synced writes, or those plus a random subset of
//! later ones, survive. The file system must reopen at the last commit (or the one in
//! flight), lose nothing committed, and pass fsck.

use insitu_accelfs::{fsck, CrashMode, Fs, MemDevice};
use std::collections::{BTreeMap, BTreeSet};

type Files = BTreeMap<String, Vec<u8>>;

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn sizes(f: &Files) -> BTreeMap<String, usize> {
    f.iter().map(|(n, d)| (n.clone(), d.len())).collect()
}

/// Runs random operations until power fails (or `steps` are done); returns the state at
/// the last successful sync, the state a failed sync was committing (if one failed), and
/// the files changed since that last successful sync.
fn run_until_power_loss(fs: &Fs, rng: &mut Rng, steps: usize) -> (Files, Option<Files>, BTreeSet<String>) {
    let mut model = Files::new();
    let mut committed = Files::new();
    let mut touched = BTreeSet::new();
    for step in 0..steps {
        let name = format!("f{}", rng.next(5));
        let r: Result<(), insitu_accelfs::Error> = match rng.next(8) {
            0 if !model.contains_key(&name) => fs.create(&name).map(|_| {
                model.insert(name.clone(), Vec::new());
            }),
            1..=3 if model.contains_key(&name) => {
                let (off, len) = (rng.next(40_000) as usize, 1 + rng.next(12_000) as usize);
                let data = vec![step as u8 | 1; len];
                let r = fs.open_file(&name).unwrap().write_at(&data, off as u64);
                // A failed write may have changed the file partly: treat it as changed.
                let m = model.get_mut(&name).unwrap();
                if m.len() < off + len {
                    m.resize(off + len, 0);
                }
                m[off..off + len].copy_from_slice(&data);
                r
            }
            4 if model.contains_key(&name) => {
                let len = rng.next(50_000) as usize;
                model.get_mut(&name).unwrap().resize(len, 0);
                fs.open_file(&name).unwrap().set_len(len as u64)
            }
            5 if model.contains_key(&name) => {
                model.remove(&name);
                fs.remove(&name)
            }
            6 | 7 => match fs.sync() {
                Ok(()) => {
                    committed = model.clone();
                    touched.clear();
                    Ok(())
                }
                Err(_) => return (committed, Some(model), touched),
            },
            _ => Ok(()),
        };
        touched.insert(name);
        if r.is_err() {
            // An operation failed before any sync: the commit in memory never happened.
            return (committed, None, touched);
        }
    }
    (committed, None, touched)
}

fn check_recovered(dev: &MemDevice, committed: &Files, in_flight: Option<&Files>, touched: &BTreeSet<String>, what: &str) {
    let report = fsck(dev).unwrap();
    assert!(report.is_clean(), "{what}: fsck after the crash: {:?}", report.problems);
    let fs = Fs::open(dev.clone(), 0).unwrap_or_else(|e| panic!("{what}: reopening after the crash: {e}"));
    let got: BTreeMap<String, usize> = fs.list().into_iter().map(|e| (e.name, e.size as usize)).collect();
    let read = |name: &str, len: usize| {
        let mut b = vec![0u8; len];
        fs.open_file(name).unwrap().read_exact_at(&mut b, 0).unwrap();
        b
    };
    if got == sizes(committed) {
        // The last commit: files untouched since hold exactly what it committed.
        for (name, data) in committed.iter().filter(|(n, _)| !touched.contains(*n)) {
            assert!(read(name, data.len()) == *data, "{what}: committed file {name} lost data");
        }
    } else {
        let flight = in_flight.unwrap_or_else(|| panic!("{what}: recovered {got:?}, but the last commit was {:?}", sizes(committed)));
        assert_eq!(got, sizes(flight), "{what}: recovered neither the last commit nor the one in flight");
        // The in-flight commit's data was synced before its superblock was written.
        for (name, data) in flight {
            assert!(read(name, data.len()) == *data, "{what}: in-flight commit's file {name} differs");
        }
    }
}

#[test]
fn power_loss_at_any_write_recovers_the_last_commit() {
    for seed in 1..=300u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let dev = MemDevice::new(1 << 20);
        let fs = Fs::format(dev.clone(), 0).unwrap();
        let budget = rng.next(400);
        dev.fail_after_writes(Some(budget));
        let (committed, in_flight, touched) = run_until_power_loss(&fs, &mut rng, 200);
        for mode in [CrashMode::DropUnsynced, CrashMode::KeepRandom { seed }] {
            let after = dev.crash(mode);
            check_recovered(&after, &committed, in_flight.as_ref(), &touched, &format!("seed {seed}, {budget} writes, {mode:?}"));
        }
        drop(fs);
    }
}

#[test]
fn a_crash_between_operations_keeps_every_sync() {
    for seed in 1..=100u64 {
        let mut rng = Rng(seed.wrapping_mul(0xD134_2543_DE82_EF95) | 1);
        let dev = MemDevice::new(1 << 20);
        let fs = Fs::format(dev.clone(), 0).unwrap();
        let steps = rng.next(150) as usize;
        let (committed, in_flight, touched) = run_until_power_loss(&fs, &mut rng, steps);
        assert!(in_flight.is_none());
        let after = dev.crash(CrashMode::KeepRandom { seed });
        check_recovered(&after, &committed, None, &touched, &format!("seed {seed}"));
        // And the recovered file system carries on: more work, a sync, a clean fsck.
        let fs2 = Fs::open(after.clone(), 0).unwrap();
        fs2.create("after").unwrap().write_at(&[1; 20_000], 0).unwrap();
        fs2.sync().unwrap();
        assert!(fs2.fsck().unwrap().is_clean());
        drop(fs);
    }
}
