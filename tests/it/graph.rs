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
      numbers["numbers<br/>numbers · every step"]
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
      "numbers" [label="numbers\nnumbers · every step"];
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
      numbers["numbers<br/>numbers · every step"]
      square["square<br/>square · every step"]
      offsets -- "offsets" --> square
      numbers -- "numbers" --> square
    "#);
}
