//! The stage graph of a spec: `after:` edges checked for dangling names and cycles, table
//! wiring checked against the declared inputs and outputs, and per-step execution order.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use petgraph::algo::{has_path_connecting, tarjan_scc, toposort};
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::spec::{SourceDoc, Spec, SpecError, SpecErrors};
use crate::stage::TableSpec;

/// A checked spec with its stage graph: what the engine runs.
///
/// Invariants: the `after:` graph is acyclic, the writers of a table agree on its schema, and
/// every table a stage reads has exactly one writer, upstream of it. A table with several
/// writers (a log that several stages append to, such as skill events) gets one file per writer
/// and step, and no stage can read it.
pub struct Pipeline {
    spec: Spec,
    graph: DiGraph<usize, ()>,
    /// Stage indices in a topological order that prefers declaration order.
    order: Vec<usize>,
    inputs: Vec<Vec<TableSpec>>,
    outputs: Vec<Vec<TableSpec>>,
    /// For each table, the index of (the first) stage that writes it.
    writers: BTreeMap<String, usize>,
}

/// A stage's settings as `key.path=value` lines, so that a graph shows how two specs differ
/// (quotes become `'` to keep the graph syntax intact).
fn settings(config: &serde_json::Value) -> Vec<String> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&path, value, out);
                }
            }
            serde_json::Value::String(text) => out.push(format!("{prefix}={}", text.replace('"', "'"))),
            other => out.push(format!("{prefix}={}", other.to_string().replace('"', "'"))),
        }
    }
    let mut out = Vec::new();
    walk("", config, &mut out);
    out.sort();
    out
}

/// The graph formats `sesa graph` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphFormat {
    /// Mermaid `flowchart`, for Markdown.
    Mermaid,
    /// Graphviz.
    Dot,
}

impl Pipeline {
    /// Checks the graph of `spec` (whose `after:` names all exist, as `Spec` guarantees); keys
    /// are located through `source`.
    pub fn new(spec: Spec, source: &SourceDoc) -> Result<Pipeline, SpecErrors> {
        let mut problems = Vec::new();
        let mut graph = DiGraph::new();
        let nodes: Vec<NodeIndex> = (0..spec.stages.len()).map(|i| graph.add_node(i)).collect();
        let index_of: HashMap<&str, usize> =
            spec.stages.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
        let names: Vec<String> = spec.stages.iter().map(|s| s.name.clone()).collect();
        for (child, stage) in spec.stages.iter().enumerate() {
            // `Spec` guarantees every `after` name exists.
            for parent in stage.after.iter().filter_map(|p| index_of.get(p.as_str())) {
                graph.update_edge(nodes[*parent], nodes[child], ());
            }
        }
        for component in tarjan_scc(&graph) {
            let is_cycle = component.len() > 1 || graph.contains_edge(component[0], component[0]);
            if is_cycle {
                let cycle = cycle_through(&graph, &component);
                problems.push(SpecError::Cycle { cycle: cycle.iter().map(|&n| names[graph[n]].clone()).collect() });
            }
        }

        let inputs: Vec<Vec<TableSpec>> = spec.stages.iter().map(|s| s.stage.inputs()).collect();
        let outputs: Vec<Vec<TableSpec>> = spec.stages.iter().map(|s| s.stage.outputs()).collect();
        let mut writers: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (index, tables) in outputs.iter().enumerate() {
            for table in tables {
                writers.entry(table.name.clone()).or_default().push(index);
            }
        }
        let declared = |table: &str, stage: usize| {
            outputs[stage].iter().find(|t| t.name == table).map(|t| t.schema.clone()).expect("stage writes table")
        };
        for (table, stages) in &writers {
            if stages.iter().any(|&s| declared(table, s) != declared(table, stages[0])) {
                problems.push(SpecError::ConflictingOutputs {
                    table: table.clone(),
                    stages: stages.iter().map(|&i| names[i].clone()).collect(),
                });
            }
        }
        for (reader, tables) in inputs.iter().enumerate() {
            for table in tables {
                if let Some(stages) = writers.get(&table.name).filter(|s| s.len() > 1) {
                    problems.push(SpecError::SharedInput {
                        location: source.locate(&format!("stages.{}", names[reader])),
                        stage: names[reader].clone(),
                        table: table.name.clone(),
                        writers: stages.iter().map(|&i| names[i].clone()).collect(),
                    });
                }
            }
        }
        let shared: Vec<String> = writers.iter().filter(|(_, s)| s.len() > 1).map(|(t, _)| t.clone()).collect();
        let writers: BTreeMap<String, usize> = writers.into_iter().map(|(t, s)| (t, s[0])).collect();
        let acyclic = !problems.iter().any(|p| matches!(p, SpecError::Cycle { .. }));
        for (reader, tables) in inputs.iter().enumerate() {
            for table in tables {
                if shared.contains(&table.name) {
                    continue;
                }
                let writer = writers.get(&table.name).copied();
                let upstream = writer.is_some_and(|w| {
                    acyclic && w != reader && has_path_connecting(&graph, nodes[w], nodes[reader], None)
                });
                if !upstream && (acyclic || writer.is_none()) {
                    problems.push(SpecError::MissingInput {
                        location: source.locate(&format!("stages.{}", names[reader])),
                        stage: names[reader].clone(),
                        table: table.name.clone(),
                        producer: writer.map(|w| names[w].clone()),
                    });
                }
            }
        }
        if !problems.is_empty() {
            return Err(SpecErrors(problems));
        }
        let order = stable_topological_order(&graph);
        Ok(Pipeline { spec, graph, order, inputs, outputs, writers })
    }

    /// The spec this pipeline runs.
    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// The stages that run at `step`, in a valid execution order.
    pub fn active(&self, step: u64) -> Vec<usize> {
        let steps = self.spec.steps;
        self.order.iter().copied().filter(|&i| self.spec.stages[i].schedule.fires(step, steps)).collect()
    }

    /// The stages that `stage` waits for at `step`: its nearest ancestors that run at `step`,
    /// looking through ancestors that do not run then.
    pub fn active_dependencies(&self, stage: usize, step: u64) -> Vec<usize> {
        let steps = self.spec.steps;
        let mut found = Vec::new();
        let mut stack = vec![NodeIndex::new(stage)];
        let mut seen = vec![false; self.spec.stages.len()];
        while let Some(node) = stack.pop() {
            for edge in self.graph.edges_directed(node, petgraph::Direction::Incoming) {
                let parent = edge.source();
                let index = self.graph[parent];
                if std::mem::replace(&mut seen[index], true) {
                    continue;
                }
                if self.spec.stages[index].schedule.fires(step, steps) {
                    found.push(index);
                } else {
                    stack.push(parent);
                }
            }
        }
        found.sort_unstable();
        found
    }

    /// The tables stage `index` reads.
    pub fn inputs(&self, index: usize) -> &[TableSpec] {
        &self.inputs[index]
    }

    /// The tables stage `index` writes.
    pub fn outputs(&self, index: usize) -> &[TableSpec] {
        &self.outputs[index]
    }

    /// The stage that writes `table`.
    pub fn writer(&self, table: &str) -> Option<usize> {
        self.writers.get(table).copied()
    }

    /// Renders the graph with each stage's kind and schedule; data edges are labelled with the
    /// tables that flow along them.
    pub fn render(&self, format: GraphFormat) -> String {
        let stages = &self.spec.stages;
        // (writer, reader) -> tables read, and whether `after` links them directly.
        let mut flows: BTreeMap<(usize, usize), Vec<&str>> = BTreeMap::new();
        for (reader, tables) in self.inputs.iter().enumerate() {
            for table in tables {
                if let Some(writer) = self.writer(&table.name) {
                    flows.entry((writer, reader)).or_default().push(&table.name);
                }
            }
        }
        let mut edges: Vec<(usize, usize, Vec<&str>, bool)> = Vec::new();
        for &child in &self.order {
            for edge in self.graph.edges_directed(NodeIndex::new(child), petgraph::Direction::Incoming) {
                let parent = self.graph[edge.source()];
                let tables = flows.remove(&(parent, child)).unwrap_or_default();
                edges.push((parent, child, tables, true));
            }
        }
        for ((writer, reader), tables) in flows {
            edges.push((writer, reader, tables, false));
        }
        let mut out = String::new();
        match format {
            GraphFormat::Mermaid => {
                let _ = writeln!(out, "flowchart TD");
                for &i in &self.order {
                    let s = &stages[i];
                    let settings: String = settings(&s.config).iter().map(|line| format!("<br/>{line}")).collect();
                    let _ = writeln!(out, "  {}[\"{}<br/>{} · {}{settings}\"]", s.name, s.name, s.kind, s.schedule);
                }
                for (from, to, tables, direct) in edges {
                    let (from, to) = (&stages[from].name, &stages[to].name);
                    let label = tables.join(", ");
                    let _ = match (direct, label.is_empty()) {
                        (true, true) => writeln!(out, "  {from} --> {to}"),
                        (true, false) => writeln!(out, "  {from} -- \"{label}\" --> {to}"),
                        (false, _) => writeln!(out, "  {from} -. \"{label}\" .-> {to}"),
                    };
                }
            }
            GraphFormat::Dot => {
                let _ = writeln!(out, "digraph \"{}\" {{", self.spec.name);
                let _ = writeln!(out, "  rankdir=TB;\n  node [shape=box];");
                for &i in &self.order {
                    let s = &stages[i];
                    let settings: String = settings(&s.config).iter().map(|line| format!("\\n{line}")).collect();
                    let _ = writeln!(
                        out,
                        "  \"{}\" [label=\"{}\\n{} · {}{settings}\"];",
                        s.name, s.name, s.kind, s.schedule
                    );
                }
                for (from, to, tables, direct) in edges {
                    let style = if direct { "" } else { ", style=dashed" };
                    let _ = writeln!(
                        out,
                        "  \"{}\" -> \"{}\" [label=\"{}\"{style}];",
                        stages[from].name,
                        stages[to].name,
                        tables.join(", ")
                    );
                }
                let _ = writeln!(out, "}}");
            }
        }
        out
    }
}

/// Kahn's algorithm, always taking the ready stage declared first, so the order is the spec's
/// wherever the edges allow.
fn stable_topological_order(graph: &DiGraph<usize, ()>) -> Vec<usize> {
    debug_assert!(toposort(graph, None).is_ok());
    let mut indegree: Vec<usize> =
        graph.node_indices().map(|n| graph.edges_directed(n, petgraph::Direction::Incoming).count()).collect();
    let mut ready: std::collections::BTreeSet<usize> = (0..indegree.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(indegree.len());
    while let Some(next) = ready.pop_first() {
        order.push(graph[NodeIndex::new(next)]);
        for child in graph.neighbors_directed(NodeIndex::new(next), petgraph::Direction::Outgoing) {
            indegree[child.index()] -= 1;
            if indegree[child.index()] == 0 {
                ready.insert(child.index());
            }
        }
    }
    order
}

/// A cycle inside a strongly connected component, as a path that returns to its start.
fn cycle_through(graph: &DiGraph<usize, ()>, component: &[NodeIndex]) -> Vec<NodeIndex> {
    let start = *component.iter().min_by_key(|n| graph[**n]).expect("components are non-empty");
    let mut path = vec![start];
    let mut visited = vec![start];
    // Walk successors inside the component until we come back to `start`; a DFS with
    // backtracking guarantees we find the way back because the component is strongly connected.
    fn walk(
        graph: &DiGraph<usize, ()>,
        component: &[NodeIndex],
        start: NodeIndex,
        path: &mut Vec<NodeIndex>,
        visited: &mut Vec<NodeIndex>,
    ) -> bool {
        let here = *path.last().expect("path starts non-empty");
        let mut next: Vec<NodeIndex> = graph.neighbors(here).filter(|n| component.contains(n)).collect();
        next.sort_by_key(|n| graph[*n]);
        for node in next {
            if node == start {
                path.push(start);
                return true;
            }
            if !visited.contains(&node) {
                visited.push(node);
                path.push(node);
                if walk(graph, component, start, path, visited) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    walk(graph, component, start, &mut path, &mut visited);
    path
}
