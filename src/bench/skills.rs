//! `sesa bench-skills`: the skill embedder and bank retrieval.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use sesa_stages::data::datasets::load_questions;

/// `sesa bench-skills`: embedding throughput of the skill embedder on a question set, one
/// query's embedding latency, and exact top-3 retrieval latency in banks of 800 and 100,000
/// skills.
pub async fn bench_skills(questions: &Path, limit: usize) -> Result<u8> {
    use rand::{Rng, SeedableRng};
    use sesa_stages::memory::{Embedder, MiniLm, Skill, SkillBank, SkillMeta, SkillText};
    use sesa_stages::sections::MemorySection;

    let texts: Vec<String> = load_questions(questions)?.into_iter().take(limit).map(|q| q.question).collect();
    let directory = sesa_models::cache::resolve_or_fetch("all-minilm-l6-v2").await?;
    let model = MiniLm::load(&directory)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    model.embed_batch(&refs[..refs.len().min(32)])?; // warm up
    let clock = Instant::now();
    let vectors = model.embed_batch(&refs)?;
    let seconds = clock.elapsed().as_secs_f64();
    println!("texts             {} (packed passes, one worker per core)", texts.len());
    println!("embedding         {:.1} texts/s ({seconds:.2} s)", texts.len() as f64 / seconds);
    let mut single = Vec::new();
    for text in refs.iter().take(100) {
        let clock = Instant::now();
        model.embed_batch(&[text])?;
        single.push(clock.elapsed().as_secs_f64() * 1e3);
    }
    single.sort_by(f64::total_cmp);
    println!("one query         p50 {:.2} ms", single[single.len() / 2]);

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    for size in [800usize, 100_000] {
        let random_unit = |rng: &mut rand_chacha::ChaCha8Rng| {
            let mut v: Vec<f32> = (0..384).map(|_| rng.random::<f32>() - 0.5).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            v
        };
        let skills: Vec<Skill> = (0..size)
            .map(|i| Skill {
                id: format!("s{i}"),
                text: SkillText {
                    description: format!("skill {i}"),
                    trigger: "t".into(),
                    avoid: Vec::new(),
                    query_template: "q".into(),
                },
                meta: SkillMeta::default(),
            })
            .collect();
        let bank_vectors = (0..size).map(|_| random_unit(&mut rng)).collect();
        let bank = SkillBank::restore(MemorySection::default_bank_config(), skills, bank_vectors, 1);
        let mut latencies: Vec<f64> = vectors
            .iter()
            .map(|query| {
                let clock = Instant::now();
                std::hint::black_box(bank.top_k(query, 3));
                clock.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        let percentile = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        println!(
            "top-3 of {size:<7} p50 {:.3} ms, p99 {:.3} ms ({} queries, exact scan)",
            percentile(0.5),
            percentile(0.99),
            latencies.len()
        );
    }
    Ok(0)
}
