//! Measures what the chunk size costs: time to the first byte and to a whole 4 MiB body read from the disk
//! tier (memory tier kept tiny), and write throughput, for several chunk sizes.
//!
//! `cargo run --release -p lacquer-storage --example chunk_size [DIR]`

use std::time::{Duration, Instant};

use lacquer_storage::{ObjectMeta, StoreBuilder};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const OBJECTS: usize = 40;

fn meta() -> ObjectMeta {
    ObjectMeta {
        status: 200,
        stored_at_ms: u64::MAX,
        ttl_ms: 3_600_000,
        ..ObjectMeta::default()
    }
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    println!("chunk   write MB/s   first-chunk p50/p99 (ms)   4MiB read p50/p99 (ms)   64KiB-range p50 (ms)");
    for chunk in [64 * KIB, 256 * KIB, 1024 * KIB, 4 * MIB - 64] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let store = StoreBuilder::new(dir.path())
            .with_memory_bytes(4 * chunk.max(MIB))
            .with_disk_bytes(1024 * MIB)
            .with_chunk_size(chunk)
            .open(tokio::runtime::Handle::current())
            .await
            .unwrap();
        let body: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
        let start = Instant::now();
        for i in 0..OBJECTS {
            let key = format!("k{i}");
            let mut w = store.writer(&key, &[], store.mark()).unwrap();
            for piece in body.chunks(64 * KIB) {
                w.push(piece).await.unwrap();
            }
            w.finish(key, meta()).await.unwrap();
        }
        store.close(Duration::from_secs(60)).await.unwrap();
        let write = (OBJECTS * body.len()) as f64 / MIB as f64 / start.elapsed().as_secs_f64();
        drop(store);
        let store = loop {
            let b = StoreBuilder::new(dir.path())
                .with_memory_bytes(4 * chunk.max(MIB))
                .with_disk_bytes(1024 * MIB)
                .with_chunk_size(chunk);
            match b.open(tokio::runtime::Handle::current()).await {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let (mut first, mut whole, mut range) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..OBJECTS {
            let set = store.lookup(&format!("k{i}")).unwrap().unwrap();
            let m = &set.variants[0];
            let t = Instant::now();
            store.read_chunk(m, 0).await.unwrap().unwrap();
            first.push(t.elapsed());
            let t = Instant::now();
            for c in 1..m.chunk_count() {
                store.read_chunk(m, c).await.unwrap().unwrap();
            }
            whole.push(t.elapsed() + first[i]);
        }
        for i in 0..OBJECTS {
            let set = store.lookup(&format!("k{i}")).unwrap().unwrap();
            let m = &set.variants[0];
            // A 64 KiB range in the middle of the body: the chunk that holds it, read cold from disk.
            let offset = 2 * MIB + 4096;
            let t = Instant::now();
            store
                .read_chunk(m, (offset / m.chunk_size as usize) as u32)
                .await
                .unwrap();
            range.push(t.elapsed());
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{:>5}K  {:>10.0}   {:>10.2} / {:<10.2}   {:>8.2} / {:<8.2}   {:>8.2}",
            chunk / KIB,
            write,
            ms(percentile(&mut first, 0.5)),
            ms(percentile(&mut first, 0.99)),
            ms(percentile(&mut whole, 0.5)),
            ms(percentile(&mut whole, 0.99)),
            ms(percentile(&mut range, 0.5)),
        );
        store.close(Duration::from_secs(10)).await.unwrap();
    }
}
