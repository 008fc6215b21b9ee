//! `sesa graph`: the rendered graph shows kinds, schedules and the tables on each edge.

use std::path::Path;

use sesa_engine::{GraphFormat, load_pipeline};

use crate::support::registry;

fn render(spec: &str, format: GraphFormat) -> String {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    load_pipeline(&fixtures.join(spec), &[], &registry()).unwrap().render(format)
}

#[test]
fn mermaid_graph_of_the_pipeline() {
    insta::assert_snapshot!(render("pipeline.yaml", GraphFormat::Mermaid), @r#"
    flowchart TD
      offsets["offsets<br/>offsets · once"]
      numbers["numbers<br/>numbers · every step<br/>rows=40"]
      square["square<br/>square · every step"]
      total["total<br/>total · every 2 steps"]
      offsets -- "offsets" --> square
      numbers -- "numbers" --> square
      square -- "squares" --> total
    "#);
}

#[test]
fn dot_graph_of_the_pipeline() {
    insta::assert_snapshot!(render("pipeline.yaml", GraphFormat::Dot), @r#"
    digraph "test pipeline" {
      rankdir=TB;
      node [shape=box];
      "offsets" [label="offsets\noffsets · once"];
      "numbers" [label="numbers\nnumbers · every step\nrows=40"];
      "square" [label="square\nsquare · every step"];
      "total" [label="total\ntotal · every 2 steps"];
      "offsets" -> "square" [label="offsets"];
      "numbers" -> "square" [label="numbers"];
      "square" -> "total" [label="squares"];
    }
    "#);
}

#[test]
fn the_ablation_graph_lacks_the_dropped_stage() {
    insta::assert_snapshot!(render("no_total.yaml", GraphFormat::Mermaid), @r#"
    flowchart TD
      offsets["offsets<br/>offsets · once"]
      numbers["numbers<br/>numbers · every step<br/>rows=10"]
      square["square<br/>square · every step"]
      offsets -- "offsets" --> square
      numbers -- "numbers" --> square
    "#);
}

/// The stage graph of every shipped spec: how the ablations differ from `sesa.yaml` at a glance.
#[test]
fn shipped_spec_graphs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["sesa", "ssp", "ablation_no_priming", "ablation_no_frontier", "ablation_no_distillation", "quickstart"]
    {
        let path = root.join("specs").join(format!("{name}.yaml"));
        let pipeline = sesa_engine::load_pipeline(&path, &[], &sesa_stages::registry())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        insta::assert_snapshot!(format!("graph_{name}"), pipeline.render(sesa_engine::GraphFormat::Mermaid));
    }
}
