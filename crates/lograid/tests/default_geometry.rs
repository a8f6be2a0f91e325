//! Pools with the default (large) chunk, as users create them: full rows of
//! every shape, rows sealed with smaller headers than reserved, short rows,
//! and trims, read back before and after a reopen. (A row whose header
//! shrank at sealing once overran its buffer with P=0 and 512 KiB chunks.)

#![allow(clippy::unwrap_used)] // a test that unwraps fails where it should

mod common;

use common::Model;
use lograid::device::{Member, SimMember};
use lograid::{create_pool, open_members, CreateOptions};
use std::sync::Arc;

fn run(members: usize, parity: u8) {
    let what = format!("({members},{parity}) default chunk");
    let sims: Vec<Arc<SimMember>> = (0..members)
        .map(|i| Arc::new(SimMember::new(&format!("m{i}"), 64 << 20)))
        .collect();
    let dyn_members: Vec<Arc<dyn Member>> =
        sims.iter().map(|s| s.clone() as Arc<dyn Member>).collect();
    let opts = CreateOptions {
        name: "dflt".into(),
        parity,
        ..Default::default()
    };
    let pool = create_pool(dyn_members, &opts, common::test_options())
        .unwrap_or_else(|e| panic!("{what}: create: {e}"));
    let size = (pool.status().usable_bytes / 2) / 4096 * 4096;
    let vol = pool.create_volume("vol", size).unwrap();
    let mut model = Model::new(size);
    // Sequential 1 MiB writes fill whole rows; then 4 KiB writes, trims and
    // flushes make rows with few entries, many entries and short rows.
    let mut off = 0;
    while off + (1 << 20) <= size / 2 {
        let data = model.write(off, 1 << 20);
        vol.write(off, &data)
            .unwrap_or_else(|e| panic!("{what}: write at {off}: {e}"));
        off += 1 << 20;
    }
    for i in 0..2000u64 {
        let o = (i * 7919 % (size / 4096)) * 4096;
        let data = model.write(o, 4096);
        vol.write(o, &data)
            .unwrap_or_else(|e| panic!("{what}: 4K write {i}: {e}"));
        if i % 97 == 0 {
            vol.trim(o, 64 * 1024).unwrap();
            model.trim(o, 64 * 1024);
        }
        if i % 333 == 0 {
            vol.flush().unwrap();
        }
    }
    vol.flush().unwrap();
    model.flushed();
    let mut all = vec![0u8; size as usize];
    vol.read(0, &mut all).unwrap();
    model
        .check_exact(0, &all)
        .unwrap_or_else(|m| panic!("{what}: {m}"));
    pool.close().unwrap();
    drop(vol);
    drop(pool);
    let images: Vec<Arc<dyn Member>> = sims
        .iter()
        .map(|s| Arc::new(SimMember::from_image("r", s.snapshot())) as Arc<dyn Member>)
        .collect();
    let pool = open_members(images, common::test_options(), false)
        .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let vol = pool.volume("vol").unwrap();
    vol.read(0, &mut all).unwrap();
    model
        .check_exact(0, &all)
        .unwrap_or_else(|m| panic!("{what}: after reopen: {m}"));
    pool.check_invariants().unwrap();
}

#[test]
fn default_chunk_every_shape() {
    for (n, p) in [(2, 0), (3, 0), (4, 0), (3, 1), (5, 1), (4, 2), (6, 3)] {
        run(n, p);
    }
}
