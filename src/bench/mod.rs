//! The `sesa` benchmarks, one module each: `decoding` (the forward pass's decoding steps alone),
//! `index` (BM25 latency, throughput, recall), `rollouts` (the agent loop against replay and raw generation), `skills` (embedding and bank
//! retrieval), `train` (a training step, beside PyTorch's).

mod decoding;
mod index;
mod rollouts;
mod skills;
mod train;

pub use self::decoding::bench_decoding;
pub use self::index::bench_index;
pub use self::rollouts::bench_rollouts;
pub use self::skills::bench_skills;
pub use self::train::{TrainBench, bench_train};
