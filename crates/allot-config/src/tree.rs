//! A small YAML tree that remembers where every value came from.
//!
//! Built from yaml-rust2's event parser, because the serde route stops at the first error and
//! forgets positions. Scalars keep their text; typing happens in `decode`, where the expected
//! type is known (so `rack: 1` is the text `1`, and `guaranteed: "4"` is still 4 GPUs).

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::TScalarStyle;

use crate::decode::Ctx;

/// Deepest nesting accepted. The schema needs 5; the limit keeps recursion in the decoder and
/// in `Drop` shallow whatever the input.
const DEPTH_MAX: usize = 32;

/// A position in a file: 1-based line and 1-based column (in characters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    /// Absent value: empty, `~` or `null`.
    Null,
    Scalar {
        text: String,
        /// Written in quotes or as a block scalar: always text, never a number or a bool.
        quoted: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<Entry>),
    /// Something already reported (an alias); decoders skip it silently.
    Invalid,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Node {
    pub value: Value,
    pub pos: Pos,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: String,
    pub key_pos: Pos,
    pub value: Node,
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Null => "nothing",
            Value::Scalar { .. } => "a single value",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
            Value::Invalid => "an invalid value",
        }
    }
}

enum Frame {
    Seq {
        pos: Option<Pos>,
        items: Vec<Node>,
    },
    Map {
        pos: Option<Pos>,
        entries: Vec<Entry>,
        /// The key waiting for its value; `None` inside when the key itself was invalid.
        key: Option<(Option<String>, Pos)>,
    },
}

/// Parses one YAML document. Returns `None` after a syntax error (already reported): the rest
/// of the file cannot be trusted. An empty document is `Value::Null`.
pub(crate) fn parse(ctx: &mut Ctx, text: &str) -> Option<Node> {
    parse_at(ctx, text, 0, "")
}

/// Parses line `line_index` (0-based) of a JSON-lines file on its own, so positions are the
/// file's and paths start with `prefix` (e.g. `workloads[3]`).
pub(crate) fn parse_line(
    ctx: &mut Ctx,
    line: &str,
    line_index: usize,
    prefix: &str,
) -> Option<Node> {
    parse_at(ctx, line, line_index, prefix)
}

fn parse_at(ctx: &mut Ctx, text: &str, line_offset: usize, prefix: &str) -> Option<Node> {
    let mut parser = Parser::new_from_str(text);
    let mut frames: Vec<Frame> = Vec::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    // Positions past the end (the scanner's end-of-input mark) are clamped to the last line.
    let last_line = text.lines().count().max(1);
    let last_column = text.lines().last().map_or(0, |l| l.chars().count()) + 1;
    let at = |line: usize, col: usize| {
        let (line, column) =
            if line > last_line { (last_line, last_column) } else { (line, col + 1) };
        Pos { line: line.saturating_add(line_offset), column }
    };
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(pair) => pair,
            Err(error) => {
                let pos = at(error.marker().line(), error.marker().col());
                let info = error.info();
                let fix = if info.contains("tab") || info.contains("whitespace") {
                    "indent with spaces, not tabs, and put a space after `:` and `-`"
                } else {
                    "check indentation, quotes and brackets on this line and the one before"
                };
                ctx.report(
                    pos,
                    &path_of(prefix, &frames),
                    format!("YAML syntax error: {info}"),
                    fix,
                );
                return None;
            }
        };
        let pos = at(mark.line(), mark.col());
        match event {
            Event::StreamEnd => break,
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::DocumentStart => {
                documents += 1;
                if documents > 1 {
                    ctx.report(
                        pos,
                        "",
                        "a second YAML document starts here",
                        "keep one document per file: remove the `---` line and merge the two",
                    );
                    break;
                }
            }
            Event::Alias(_) => {
                ctx.report(
                    pos,
                    &path_of(prefix, &frames),
                    "aliases (`*name`) are not supported",
                    "write the value out in full",
                );
                push(ctx, prefix, &mut frames, &mut root, Node { value: Value::Invalid, pos });
            }
            Event::Scalar(text, style, _anchor, _tag) => {
                let plain = style == TScalarStyle::Plain;
                let value = if plain && matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL")
                {
                    Value::Null
                } else {
                    Value::Scalar { text, quoted: !plain }
                };
                push(ctx, prefix, &mut frames, &mut root, Node { value, pos });
            }
            Event::SequenceStart(_, _) | Event::MappingStart(_, _) => {
                if frames.len() >= DEPTH_MAX {
                    ctx.report(
                        pos,
                        &path_of(prefix, &frames),
                        format!("nested deeper than {DEPTH_MAX} levels"),
                        "flatten the structure; allot's files need at most 5 levels",
                    );
                    return None;
                }
                frames.push(if matches!(event, Event::SequenceStart(..)) {
                    Frame::Seq { pos: Some(pos), items: Vec::new() }
                } else {
                    // A block mapping's start mark points past its first key; use the first
                    // key's position instead (set when it arrives).
                    Frame::Map { pos: None, entries: Vec::new(), key: None }
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match frames.pop() {
                    Some(Frame::Seq { pos: start, items }) => {
                        Node { value: Value::Seq(items), pos: start.unwrap_or(pos) }
                    }
                    Some(Frame::Map { pos: start, entries, .. }) => {
                        Node { value: Value::Map(entries), pos: start.unwrap_or(pos) }
                    }
                    None => continue,
                };
                push(ctx, prefix, &mut frames, &mut root, node);
            }
        }
    }
    Some(root.unwrap_or(Node { value: Value::Null, pos: Pos { line: 1 + line_offset, column: 1 } }))
}

/// Attaches a finished node to its parent (or makes it the root).
fn push(
    ctx: &mut Ctx,
    prefix: &str,
    frames: &mut [Frame],
    root: &mut Option<Node>,
    mut node: Node,
) {
    let path = path_of(prefix, frames);
    match frames.last_mut() {
        None => {
            if root.is_none() {
                *root = Some(node);
            }
        }
        Some(Frame::Seq { items, .. }) => items.push(node),
        Some(Frame::Map { pos, entries, key }) => match key.take() {
            None => {
                if pos.is_none() {
                    *pos = Some(node.pos);
                }
                let name = match &node.value {
                    Value::Scalar { text, .. } => Some(text.clone()),
                    Value::Invalid => None,
                    Value::Null => {
                        ctx.report(node.pos, &path, "empty key", "give the field a name");
                        None
                    }
                    Value::Seq(_) | Value::Map(_) => {
                        ctx.report(
                            node.pos,
                            &path,
                            format!("a key must be a name, not {}", node.kind()),
                            "write `name: value`",
                        );
                        None
                    }
                };
                *key = Some((name, node.pos));
            }
            Some((None, _)) => {}
            Some((Some(name), key_pos)) => {
                if let Some(first) = entries.iter().find(|e| e.key == name) {
                    ctx.report(
                        key_pos,
                        &path,
                        format!("`{name}` is given twice (first at line {})", first.key_pos.line),
                        "remove one of them",
                    );
                    return;
                }
                // An empty value's mark is the next token, often on a later line; point at
                // its key instead.
                if node.value == Value::Null {
                    node.pos = key_pos;
                }
                entries.push(Entry { key: name, key_pos, value: node });
            }
        },
    }
}

/// The field path of the value being built, for syntax errors and duplicate keys.
fn path_of(prefix: &str, frames: &[Frame]) -> String {
    let mut path = prefix.to_string();
    for frame in frames {
        match frame {
            Frame::Seq { items, .. } => path.push_str(&format!("[{}]", items.len())),
            Frame::Map { key: Some((Some(name), _)), .. } => {
                path = crate::decode::join(&path, name);
            }
            Frame::Map { .. } => {}
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(text: &str) -> (Option<Node>, Vec<String>) {
        let mut ctx = Ctx::new("t.yaml");
        let node = parse(&mut ctx, text);
        (node, ctx.into_diagnostics().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn positions_are_one_based() {
        let (node, diags) = tree("a:\n  b: 1\n  c:\n");
        assert!(diags.is_empty(), "{diags:?}");
        let Some(Node { value: Value::Map(top), pos }) = node else { panic!("not a map") };
        assert_eq!(pos, Pos { line: 1, column: 1 });
        let Value::Map(inner) = &top[0].value.value else { panic!("not a map") };
        assert_eq!(inner[0].key_pos, Pos { line: 2, column: 3 });
        assert_eq!(inner[0].value.pos, Pos { line: 2, column: 6 });
        // An empty value points at its key.
        assert_eq!(inner[1].value.pos, Pos { line: 3, column: 3 });
    }

    #[test]
    fn duplicate_keys_and_aliases_are_reported() {
        let (_, diags) = tree("a: &x 1\nb: *x\na: 2\n");
        assert_eq!(
            diags,
            [
                "t.yaml:2:4: b: aliases (`*name`) are not supported — fix: write the value out in full",
                "t.yaml:3:1: a: `a` is given twice (first at line 1) — fix: remove one of them",
            ]
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_overflow() {
        let (node, diags) = tree(&"[".repeat(100_000));
        assert!(node.is_none());
        assert_eq!(diags.len(), 1);
    }
}
