//! Typed reading of the spanned tree, collecting every error instead of stopping at the first.
//!
//! Readers take `(ctx, node, path)` and return `Option<T>`: `None` means the problem has been
//! reported (or was reported earlier, for `Value::Invalid`), and the caller carries on with the
//! next field so that one run finds every mistake.

use allot_core::{SHARES_PER_GPU, Shares};

use crate::diagnostic::Diagnostic;
use crate::tree::{Entry, Node, Pos, Value};

/// Most diagnostics kept for one file; past it, one last diagnostic says how many were dropped.
const DIAGNOSTICS_MAX: usize = 200;

/// Longest name accepted (nodes, projects, models, …), as in DNS and Kubernetes.
const NAME_CHARS_MAX: usize = 253;

/// The error collector for one file.
#[derive(Debug)]
pub(crate) struct Ctx {
    file: String,
    diagnostics: Vec<Diagnostic>,
    dropped: usize,
}

impl Ctx {
    pub fn new(file: &str) -> Ctx {
        Ctx { file: file.to_string(), diagnostics: Vec::new(), dropped: 0 }
    }

    pub fn report(
        &mut self,
        pos: Pos,
        field: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) {
        if self.diagnostics.len() >= DIAGNOSTICS_MAX {
            self.dropped += 1;
            return;
        }
        self.diagnostics.push(Diagnostic {
            file: self.file.clone(),
            line: pos.line,
            column: pos.column,
            field: field.to_string(),
            message: message.into(),
            fix: fix.into(),
        });
    }

    pub fn has_errors(&self) -> bool {
        !self.diagnostics.is_empty()
    }

    /// Every diagnostic, in file order.
    pub fn into_diagnostics(mut self) -> Vec<Diagnostic> {
        self.diagnostics.sort();
        if self.dropped > 0 {
            let last = self
                .diagnostics
                .last()
                .map_or(Pos::default(), |d| Pos { line: d.line, column: d.column });
            self.diagnostics.push(Diagnostic {
                file: self.file.clone(),
                line: last.line,
                column: last.column,
                field: String::new(),
                message: format!(
                    "{} more problems not shown (at most {DIAGNOSTICS_MAX} are listed)",
                    self.dropped
                ),
                fix: "fix the problems above and run again".to_string(),
            });
        }
        self.diagnostics
    }

    /// `Ok(value)` only when nothing was reported.
    pub fn finish<T>(self, value: Option<T>) -> Result<T, Vec<Diagnostic>> {
        match value {
            Some(value) if !self.has_errors() => Ok(value),
            _ => {
                let file = self.file.clone();
                let mut diagnostics = self.into_diagnostics();
                if diagnostics.is_empty() {
                    // Fail closed: a decoder gave up without saying why.
                    diagnostics.push(Diagnostic {
                        file,
                        line: 0,
                        column: 0,
                        field: String::new(),
                        message: "the file could not be read as configuration".to_string(),
                        fix: "report this as a bug in allot, with the file".to_string(),
                    });
                }
                Err(diagnostics)
            }
        }
    }
}

/// An optional field's outcome: `Some(None)` when absent, `Some(Some(v))` when valid, `None`
/// when present but invalid (already reported).
pub(crate) fn optional<T>(field: Option<Option<T>>) -> Option<Option<T>> {
    match field {
        None => Some(None),
        Some(value) => value.map(Some),
    }
}

/// `path.key`, or `key` at the top.
pub(crate) fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

/// `path[i]`.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// The closest candidate to `word`, if close enough to be a likely typo.
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word_lower = word.to_lowercase();
    let threshold = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, &'a str)> = None;
    for candidate in candidates {
        let distance = levenshtein(&word_lower, &candidate.to_lowercase());
        if distance <= threshold && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// Edit distance counting a swap of two neighbours as one edit (`nmae` → `name` is 1).
fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the optimal-string-alignment table: i-2, i-1, i.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (previous[j] + 1).min(current[j - 1] + 1).min(previous[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            current[j] = d;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// "did you mean `x`?" for a likely typo, else `otherwise` followed by what is allowed
/// (e.g. `use one of` → "use one of `a`, `b` or `c`").
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str> + Clone,
    otherwise: &str,
) -> String {
    /// Most candidates listed; a policy may have thousands of projects.
    const LISTED_MAX: usize = 20;
    if let Some(close) = suggest(word, candidates.clone()) {
        return format!("did you mean `{close}`?");
    }
    let all: Vec<String> = candidates.into_iter().map(|c| format!("`{c}`")).collect();
    match all.as_slice() {
        [] => format!("{otherwise} (there are none yet)"),
        [one] => format!("{otherwise} {one}"),
        [head @ .., last] if all.len() <= LISTED_MAX => {
            format!("{otherwise} {} or {last}", head.join(", "))
        }
        _ => format!(
            "{otherwise} {}, … ({} more)",
            all[..LISTED_MAX].join(", "),
            all.len() - LISTED_MAX
        ),
    }
}

/// Thousandths as a decimal: `64000` → `64`, `500` → `0.5`.
pub(crate) fn thousandths(value: u64) -> String {
    let (whole, frac) = (value / 1000, value % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
    }
}

/// Scalar text shortened for messages.
fn shown(text: &str) -> String {
    const CHARS_MAX: usize = 40;
    if text.chars().count() <= CHARS_MAX {
        text.to_string()
    } else {
        let head: String = text.chars().take(CHARS_MAX).collect();
        format!("{head}…")
    }
}

/// The fields of a mapping, with unknown keys already reported.
#[derive(Debug)]
pub(crate) struct Fields<'n> {
    pub path: String,
    pub pos: Pos,
    entries: &'n [Entry],
}

impl<'n> Fields<'n> {
    /// The value of `key`; `None` when absent or empty.
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|e| e.key == key)
            .map(|e| &e.value)
            .filter(|n| n.value != Value::Null)
    }

    pub fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The value of a required `key`; reports it when absent or empty.
    pub fn required(&self, ctx: &mut Ctx, key: &str, fix: &str) -> Option<&'n Node> {
        match self.entries.iter().find(|e| e.key == key) {
            None => {
                ctx.report(
                    self.pos,
                    &self.path(key),
                    format!("missing required field `{key}`"),
                    fix,
                );
                None
            }
            Some(Entry { value: Node { value: Value::Null, pos }, .. }) => {
                ctx.report(*pos, &self.path(key), format!("`{key}` has no value"), fix);
                None
            }
            Some(entry) => Some(&entry.value),
        }
    }
}

/// Reads a mapping whose allowed keys are `known`; `example` shows a correct one in the fix.
pub(crate) fn fields<'n>(
    ctx: &mut Ctx,
    node: &'n Node,
    path: &str,
    what: &str,
    known: &[&str],
    example: &str,
) -> Option<Fields<'n>> {
    let entries = match &node.value {
        Value::Map(entries) => entries,
        Value::Invalid => return None,
        Value::Null => {
            ctx.report(
                node.pos,
                path,
                format!("{what} is empty"),
                format!("write it as {example}"),
            );
            return None;
        }
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("expected {what} as a mapping of fields, got {}", node.kind()),
                format!("write it as {example}"),
            );
            return None;
        }
    };
    for entry in entries {
        if !known.contains(&entry.key.as_str()) {
            ctx.report(
                entry.key_pos,
                &join(path, &entry.key),
                format!("unknown field `{}` in {what}", shown(&entry.key)),
                did_you_mean(&entry.key, known.iter().copied(), "remove it; the fields here are"),
            );
        }
    }
    Some(Fields { path: path.to_string(), pos: node.pos, entries })
}

/// Reads a list; `None` (reported) when it is something else.
pub(crate) fn list<'n>(
    ctx: &mut Ctx,
    node: &'n Node,
    path: &str,
    example: &str,
) -> Option<&'n [Node]> {
    match &node.value {
        Value::Seq(items) => Some(items),
        Value::Invalid => None,
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("expected a list, got {}", node.kind()),
                format!("write one `- ` item per entry, e.g. {example}"),
            );
            None
        }
    }
}

/// Scalar text, or a report that the value is not a single value.
pub(crate) fn text(ctx: &mut Ctx, node: &Node, path: &str, example: &str) -> Option<String> {
    match &node.value {
        Value::Scalar { text, .. } => Some(text.clone()),
        Value::Invalid => None,
        Value::Null => {
            ctx.report(node.pos, path, "has no value", format!("give it a value, e.g. {example}"));
            None
        }
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("expected a single value, got {}", node.kind()),
                format!("write one value, e.g. {example}"),
            );
            None
        }
    }
}

/// A name (node, project, model, priority class, …): 1–253 letters, digits, `-`, `_`, `.`.
pub(crate) fn name(ctx: &mut Ctx, node: &Node, path: &str, example: &str) -> Option<String> {
    let text = text(ctx, node, path, example)?;
    let ok = !text.is_empty()
        && text.chars().count() <= NAME_CHARS_MAX
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Some(text)
    } else {
        ctx.report(
            node.pos,
            path,
            format!("`{}` is not a valid name", shown(&text)),
            format!("use 1–{NAME_CHARS_MAX} letters, digits, `-`, `_` or `.` (e.g. {example})"),
        );
        None
    }
}

pub(crate) fn boolean(ctx: &mut Ctx, node: &Node, path: &str) -> Option<bool> {
    let text = text(ctx, node, path, "true")?;
    match text.to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("expected true or false, got `{}`", shown(&text)),
                "write true or false (yes/no/on/off are text in YAML 1.2)",
            );
            None
        }
    }
}

/// One of a fixed set of words.
pub(crate) fn one_of<T: Copy>(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    choices: &[(&str, T)],
) -> Option<T> {
    let names = choices.iter().map(|(n, _)| *n);
    let text = text(ctx, node, path, &format!("`{}`", choices.first().map_or("", |c| c.0)))?;
    if let Some((_, value)) = choices.iter().find(|(n, _)| *n == text) {
        return Some(*value);
    }
    ctx.report(
        node.pos,
        path,
        format!(
            "`{}` is not one of {}",
            shown(&text),
            names.clone().collect::<Vec<_>>().join(", ")
        ),
        did_you_mean(&text, names, "use one of"),
    );
    None
}

/// An exact decimal number: `digits × 10^exp10`. Parsing never goes through `f64`, so 0.1 GPU
/// is exactly 100 shares and 0.0005 GPU is caught as finer than a share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decimal {
    pub negative: bool,
    digits: Vec<u8>,
    exp10: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScaleError {
    /// Has digits below the wanted precision.
    TooFine,
    /// Does not fit in a `u64`.
    TooLarge,
}

impl Decimal {
    /// `-4`, `0.5`, `.25`, `1e3`, `+2`; not `0x10`, `1_000`, `.inf`.
    pub fn parse(text: &str) -> Option<Decimal> {
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exponent) = match s.find(['e', 'E']) {
            Some(i) => (&s[..i], Some(&s[i + 1..])),
            None => (s, None),
        };
        let (int_part, frac_part) = match mantissa.find('.') {
            Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
            None => (mantissa, ""),
        };
        let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part)
        {
            return None;
        }
        let exp: i64 = match exponent {
            None => 0,
            Some(e) => {
                let digits = e.trim_start_matches(['+', '-']);
                // Bounded so that the exponent arithmetic below cannot overflow.
                if digits.is_empty()
                    || digits.len() > 4
                    || !all_digits(digits)
                    || e.len() > digits.len() + 1
                {
                    return None;
                }
                e.parse().ok()?
            }
        };
        let frac_len = i64::try_from(frac_part.len()).ok()?;
        let digits = int_part.bytes().chain(frac_part.bytes()).map(|b| b - b'0').collect();
        Some(Decimal { negative, digits, exp10: exp - frac_len })
    }

    pub fn is_zero(&self) -> bool {
        self.digits.iter().all(|d| *d == 0)
    }

    /// Below zero (`-0` is not).
    pub fn is_negative(&self) -> bool {
        self.negative && !self.is_zero()
    }

    /// `|self| × 10^scale` as an integer.
    pub fn scaled(&self, scale: u32) -> Result<u64, ScaleError> {
        let e = self.exp10 + i64::from(scale);
        let mut kept: &[u8] = &self.digits;
        if e < 0 {
            let cut = usize::try_from(-e).unwrap_or(usize::MAX).min(kept.len());
            let (head, dropped) = kept.split_at(kept.len() - cut);
            let rest_is_zero = dropped.iter().all(|d| *d == 0);
            // Digits further right than the written ones are zeros; only written ones matter.
            if !rest_is_zero {
                return Err(ScaleError::TooFine);
            }
            kept = head;
        }
        let mut value: u64 = 0;
        for d in kept {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(*d)))
                .ok_or(ScaleError::TooLarge)?;
        }
        if e > 0 && value != 0 {
            for _ in 0..e {
                value = value.checked_mul(10).ok_or(ScaleError::TooLarge)?;
            }
        }
        Ok(value)
    }
}

/// A scalar as a number, or a report naming what was expected.
fn decimal(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    expected: &str,
    example: &str,
) -> Option<(Decimal, String)> {
    let text = text(ctx, node, path, example)?;
    match Decimal::parse(&text) {
        Some(d) => Some((d, text)),
        None => {
            ctx.report(
                node.pos,
                path,
                format!("expected {expected}, got `{}`", shown(&text)),
                format!("write a number, e.g. {example}"),
            );
            None
        }
    }
}

/// A whole number in `min..=max`.
pub(crate) fn uint(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    min: u64,
    max: u64,
    example: &str,
) -> Option<u64> {
    let (d, text) = decimal(ctx, node, path, "a whole number", example)?;
    let value = match d.scaled(0) {
        Ok(_) if d.is_negative() => None,
        Ok(v) => Some(v),
        Err(ScaleError::TooFine) => {
            ctx.report(
                node.pos,
                path,
                format!("must be a whole number, got {text}"),
                format!("write e.g. {example}"),
            );
            return None;
        }
        Err(ScaleError::TooLarge) => None,
    };
    match value {
        Some(v) if (min..=max).contains(&v) => Some(v),
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("must be between {min} and {max}, got {}", shown(&text)),
                format!("write a whole number in that range, e.g. {example}"),
            );
            None
        }
    }
}

/// A whole number that may be negative, in `i32`'s range.
pub(crate) fn int32(ctx: &mut Ctx, node: &Node, path: &str, example: &str) -> Option<i32> {
    let (d, text) = decimal(ctx, node, path, "a whole number", example)?;
    let magnitude = match d.scaled(0) {
        Ok(v) => v,
        Err(ScaleError::TooFine) => {
            ctx.report(
                node.pos,
                path,
                format!("must be a whole number, got {text}"),
                format!("write e.g. {example}"),
            );
            return None;
        }
        Err(ScaleError::TooLarge) => u64::MAX,
    };
    let value = i64::try_from(magnitude).ok().map(|m| if d.is_negative() { -m } else { m });
    match value.and_then(|v| i32::try_from(v).ok()) {
        Some(v) => Some(v),
        None => {
            ctx.report(
                node.pos,
                path,
                format!("must be between {} and {}, got {}", i32::MIN, i32::MAX, shown(&text)),
                format!("write a smaller number, e.g. {example}"),
            );
            None
        }
    }
}

/// A non-negative decimal in thousandths (`1.5` → 1500): GPUs as shares, weights, cores.
fn milli(ctx: &mut Ctx, node: &Node, path: &str, unit: &str, example: &str) -> Option<u64> {
    let (d, text) = decimal(ctx, node, path, &format!("a number of {unit}"), example)?;
    if d.is_negative() {
        ctx.report(
            node.pos,
            path,
            format!("must be ≥ 0, got {}", shown(&text)),
            format!("set a non-negative number of {unit} (e.g. {example})"),
        );
        return None;
    }
    let finer = format!("finer than 1/1000 of one of the {unit}");
    scaled_milli(ctx, node, path, &d, &text, &finer, &format!("write e.g. {example}"))
}

/// `d` in thousandths, reporting a value finer than 0.001 or too large to hold.
fn scaled_milli(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    d: &Decimal,
    text: &str,
    finer: &str,
    too_large_fix: &str,
) -> Option<u64> {
    match d.scaled(3) {
        Ok(v) => Some(v),
        Err(ScaleError::TooFine) => {
            ctx.report(
                node.pos,
                path,
                format!("{} is {finer}", shown(text)),
                "round to at most three decimals (e.g. 0.125)",
            );
            None
        }
        Err(ScaleError::TooLarge) => {
            ctx.report(node.pos, path, format!("{} is too large", shown(text)), too_large_fix);
            None
        }
    }
}

/// A number of GPUs (decimal allowed) as shares.
pub(crate) fn gpus_as_shares(ctx: &mut Ctx, node: &Node, path: &str) -> Option<Shares> {
    milli(ctx, node, path, "GPUs", "4 or 0.5").map(Shares)
}

/// A fair-share weight in thousandths; must be > 0.
pub(crate) fn weight_milli(ctx: &mut Ctx, node: &Node, path: &str) -> Option<u64> {
    let (d, text) = decimal(ctx, node, path, "a weight", "1 or 2.5")?;
    let fix = "use a positive weight, e.g. 1 or 2.5 (a small one like 0.1 ranks the project last)";
    if d.is_negative() || d.is_zero() {
        ctx.report(node.pos, path, format!("must be > 0, got {}", shown(&text)), fix);
        return None;
    }
    scaled_milli(ctx, node, path, &d, &text, "finer than 0.001", fix)
}

/// A percentage from 0 to 100 as permille: `10%`, `10` and `10 %` are 100, `2.5%` is 25.
/// A bare number is a percentage too (`0.5` is half a percent, not half of everything).
pub(crate) fn percent_permille(ctx: &mut Ctx, node: &Node, path: &str) -> Option<u16> {
    let raw = text(ctx, node, path, "10%")?;
    let fix = "write a percentage from 0 to 100 with at most one decimal, e.g. 10% or 2.5%";
    let number = raw.trim().strip_suffix('%').unwrap_or(&raw);
    let Some(d) = Decimal::parse(number) else {
        ctx.report(node.pos, path, format!("`{}` is not a percentage", shown(&raw)), fix);
        return None;
    };
    let permille = match d.scaled(1) {
        Ok(_) if d.is_negative() => None,
        Ok(v) => u16::try_from(v).ok().filter(|v| *v <= 1000),
        Err(ScaleError::TooFine) => {
            ctx.report(
                node.pos,
                path,
                format!("{} is finer than 0.1 %", shown(&raw)),
                "round to one decimal, e.g. 2.5%",
            );
            return None;
        }
        Err(ScaleError::TooLarge) => None,
    };
    if permille.is_none() {
        ctx.report(
            node.pos,
            path,
            format!("must be between 0 and 100 %, got {}", shown(&raw)),
            fix,
        );
    }
    permille
}

/// CPU as cores (`64`, `0.5`) or millicores (`64000m`), in millicores.
pub(crate) fn cpu_millis(ctx: &mut Ctx, node: &Node, path: &str) -> Option<u64> {
    if let Value::Scalar { text, .. } = &node.value
        && let Some(millicores) = text.trim().strip_suffix('m')
    {
        return match Decimal::parse(millicores).filter(|d| !d.is_negative()).map(|d| d.scaled(0)) {
            Some(Ok(v)) => Some(v),
            _ => {
                ctx.report(
                    node.pos,
                    path,
                    format!("`{}` is not a whole number of millicores", shown(text)),
                    "write cores as a number (e.g. 64 or 0.5) or millicores (e.g. 64000m)",
                );
                None
            }
        };
    }
    milli(ctx, node, path, "CPU cores", "64, 0.5 or 64000m")
}

const BINARY_UNITS: [(&str, u64); 5] =
    [("Ki", 0), ("Mi", 1), ("Gi", 1024), ("Ti", 1024 * 1024), ("Pi", 1024 * 1024 * 1024)];

/// Memory as `512Gi`, `1024Mi`, `1.5Ti` or a whole number of MiB, in MiB.
pub(crate) fn memory_mib(ctx: &mut Ctx, node: &Node, path: &str) -> Option<u64> {
    let raw = text(ctx, node, path, "512Gi")?;
    let fix = "write a whole number of MiB or a size with a binary unit: Mi, Gi, Ti (e.g. 80Gi)";
    let s = raw.trim();
    let split =
        s.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let Some(d) = Decimal::parse(number) else {
        ctx.report(node.pos, path, format!("`{}` is not a memory size", shown(&raw)), fix);
        return None;
    };
    if d.is_negative() {
        ctx.report(node.pos, path, format!("must be ≥ 0, got {}", shown(&raw)), fix);
        return None;
    }
    let mib = if unit.is_empty() {
        d.scaled(0).map_err(|e| (e, "a fraction of a MiB"))
    } else if let Some((_, factor)) = BINARY_UNITS.iter().find(|(u, _)| *u == unit) {
        // Exact: thousandths of the unit, times the unit in MiB, must come to whole MiB.
        d.scaled(3).map_err(|e| (e, "more than three decimals")).and_then(|thousandths| {
            let (numerator, denominator) = if unit == "Ki" {
                (u128::from(thousandths), 1000u128 * 1024)
            } else {
                (u128::from(thousandths) * u128::from(*factor), 1000)
            };
            if numerator % denominator != 0 {
                Err((ScaleError::TooFine, "not a whole number of MiB"))
            } else {
                u64::try_from(numerator / denominator).map_err(|_| (ScaleError::TooLarge, ""))
            }
        })
    } else {
        let binary = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
            "K" => Some("Ki"),
            "M" => Some("Mi"),
            "G" => Some("Gi"),
            "T" => Some("Ti"),
            "P" => Some("Pi"),
            _ => None,
        };
        let message = format!("unknown memory unit `{}` in `{}`", shown(unit), shown(&raw));
        match binary {
            Some(b) => ctx.report(
                node.pos,
                path,
                message,
                format!(
                    "use the binary unit `{b}` (e.g. `{}{b}`); decimal units are not exact in MiB",
                    number.trim()
                ),
            ),
            None => ctx.report(node.pos, path, message, fix),
        }
        return None;
    };
    match mib {
        Ok(v) => Some(v),
        Err((ScaleError::TooFine, why)) => {
            ctx.report(node.pos, path, format!("`{}` is {why}", shown(&raw)), fix);
            None
        }
        Err((ScaleError::TooLarge, _)) => {
            ctx.report(node.pos, path, format!("`{}` is too large", shown(&raw)), fix);
            None
        }
    }
}

const DURATION_UNITS: [(&str, u64); 5] =
    [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)];

/// Why a duration did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DurationError {
    Negative,
    Malformed,
    UnknownUnit(String),
    TooFine,
    TooLarge,
}

/// `30s`, `15m`, `2h`, `7d`, `500ms`, `1h30m`, `1.5h`, or a whole number of milliseconds.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, DurationError> {
    let s = text.trim();
    if s.starts_with('-') {
        return Err(DurationError::Negative);
    }
    if let Some(d) = Decimal::parse(s) {
        return d.scaled(0).map_err(|e| match e {
            ScaleError::TooFine => DurationError::TooFine,
            ScaleError::TooLarge => DurationError::TooLarge,
        });
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let number_len =
            rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if number.is_empty() || unit.is_empty() {
            return Err(DurationError::Malformed);
        }
        let Some((_, factor)) = DURATION_UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(DurationError::UnknownUnit(unit.to_string()));
        };
        let d = Decimal::parse(number).ok_or(DurationError::Malformed)?;
        let thousandths = d.scaled(3).map_err(|e| match e {
            ScaleError::TooFine => DurationError::TooFine,
            ScaleError::TooLarge => DurationError::TooLarge,
        })?;
        let micro = u128::from(thousandths) * u128::from(*factor);
        if micro % 1000 != 0 {
            return Err(DurationError::TooFine);
        }
        let ms = u64::try_from(micro / 1000).map_err(|_| DurationError::TooLarge)?;
        total = total.checked_add(ms).ok_or(DurationError::TooLarge)?;
        rest = after;
    }
    Ok(total)
}

/// Milliseconds as a duration in the file's own format, for messages: `900000` → `15m`,
/// `5400000` → `1h30m`, `90500` → `1m30s500ms`, `0` → `0s`.
pub(crate) fn format_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (unit, factor) in DURATION_UNITS.iter().rev() {
        if rest >= *factor {
            out.push_str(&format!("{}{unit}", rest / factor));
            rest %= factor;
        }
    }
    out
}

/// A duration in milliseconds (see [`parse_duration_ms`]).
pub(crate) fn duration_ms(ctx: &mut Ctx, node: &Node, path: &str) -> Option<u64> {
    let raw = text(ctx, node, path, "30s")?;
    let fix = "write a number with a unit (ms, s, m, h or d), e.g. 30s, 15m, 2h, 7d or 1h30m, \
               or a whole number of milliseconds";
    match parse_duration_ms(&raw) {
        Ok(ms) => Some(ms),
        Err(error) => {
            let message = match error {
                DurationError::Negative => format!("must be ≥ 0, got {}", shown(&raw)),
                DurationError::Malformed => format!("`{}` is not a duration", shown(&raw)),
                DurationError::UnknownUnit(unit) => {
                    format!("unknown unit `{}` in duration `{}`", shown(&unit), shown(&raw))
                }
                DurationError::TooFine => {
                    format!("`{}` is not a whole number of milliseconds", shown(&raw))
                }
                DurationError::TooLarge => format!("`{}` is too long", shown(&raw)),
            };
            ctx.report(node.pos, path, message, fix);
            None
        }
    }
}

/// Whole GPUs per member as an integer, or a fraction below one as shares.
pub(crate) fn gpu_request(
    ctx: &mut Ctx,
    node: &Node,
    path: &str,
    whole_max: u64,
) -> Option<allot_core::GpuRequest> {
    use allot_core::{GpuRequest, MigProfile};
    if let Value::Scalar { text, .. } = &node.value {
        if let Some(profile) = MigProfile::parse(text) {
            return Some(GpuRequest::Mig(profile));
        }
        if text.to_ascii_lowercase().contains("gb") {
            ctx.report(
                node.pos,
                path,
                format!("`{}` is not a MIG profile", shown(text)),
                "write a MIG profile as <compute slices>g.<memory>gb with 1 to 7 compute slices, \
                 e.g. `3g.40gb` or `1g.10gb+me`, or a number of GPUs",
            );
            return None;
        }
    }
    let (d, text) = decimal(ctx, node, path, "a number of GPUs", "1, 8, 0.25 or 3g.40gb")?;
    let fix_range =
        format!("ask for 1 to {whole_max} whole GPUs, or a fraction from 0.001 to 0.999");
    if d.is_negative() || d.is_zero() {
        ctx.report(node.pos, path, format!("must be > 0, got {}", shown(&text)), fix_range);
        return None;
    }
    match d.scaled(3) {
        Err(ScaleError::TooFine) => {
            ctx.report(
                node.pos,
                path,
                format!("{} is finer than 1/1000 of a GPU (the smallest share)", shown(&text)),
                "round to at most three decimals (e.g. 0.125)",
            );
            None
        }
        Ok(shares) if shares < SHARES_PER_GPU => u32::try_from(shares).ok().map(GpuRequest::Shares),
        Ok(shares) if shares % SHARES_PER_GPU != 0 => {
            ctx.report(
                node.pos,
                path,
                format!("{} GPUs: fractions are only allowed below one GPU", shown(&text)),
                "ask for a whole number of GPUs per member, \
                 or a fraction below 1 with more members",
            );
            None
        }
        Ok(shares) if shares / SHARES_PER_GPU <= whole_max => {
            u32::try_from(shares / SHARES_PER_GPU).ok().map(GpuRequest::Whole)
        }
        _ => {
            ctx.report(
                node.pos,
                path,
                format!("{} GPUs per member is too many", shown(&text)),
                fix_range,
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_exact() {
        let milli = |s: &str| Decimal::parse(s).map(|d| d.scaled(3));
        assert_eq!(milli("0.5"), Some(Ok(500)));
        assert_eq!(milli(".25"), Some(Ok(250)));
        assert_eq!(milli("4"), Some(Ok(4000)));
        assert_eq!(milli("1e3"), Some(Ok(1_000_000)));
        assert_eq!(milli("1.5E-1"), Some(Ok(150)));
        assert_eq!(milli("0.1230"), Some(Ok(123)));
        assert_eq!(milli("0.0005"), Some(Err(ScaleError::TooFine)));
        assert_eq!(milli("5e-9"), Some(Err(ScaleError::TooFine)));
        assert_eq!(milli("99999999999999999999"), Some(Err(ScaleError::TooLarge)));
        assert_eq!(milli("1e9999"), Some(Err(ScaleError::TooLarge)));
        assert_eq!(milli("0e9999"), Some(Ok(0)));
        for bad in ["", ".", "-", "1.2.3", "0x10", "1_000", ".inf", "e5", "1e", "1e+-2", "four"] {
            assert_eq!(Decimal::parse(bad), None, "{bad}");
        }
        assert!(Decimal::parse("-4").is_some_and(|d| d.is_negative()));
        assert!(Decimal::parse("-0").is_some_and(|d| !d.is_negative()));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("15m"), Ok(900_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("1.5h"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1500"), Ok(1500));
        assert_eq!(parse_duration_ms("0"), Ok(0));
        assert_eq!(parse_duration_ms("-5m"), Err(DurationError::Negative));
        assert_eq!(parse_duration_ms("5 minutes"), Err(DurationError::Malformed));
        assert_eq!(parse_duration_ms("7days"), Err(DurationError::UnknownUnit("days".into())));
        assert_eq!(parse_duration_ms("0.5ms"), Err(DurationError::TooFine));
        assert_eq!(parse_duration_ms("99999999999999999d"), Err(DurationError::TooLarge));
        for ms in [0, 1, 999, 1000, 60_000, 900_000, 5_400_000, 90_500, 86_400_000, u64::MAX] {
            assert_eq!(parse_duration_ms(&format_duration(ms)), Ok(ms), "{ms}");
        }
        assert_eq!(format_duration(900_000), "15m");
        assert_eq!(format_duration(5_400_000), "1h30m");
        assert_eq!(format_duration(90_500), "1m30s500ms");
    }

    fn node(text: &str) -> Node {
        Node { value: Value::Scalar { text: text.into(), quoted: false }, pos: Pos::default() }
    }

    #[test]
    fn percentages() {
        let mut ctx = Ctx::new("p.yaml");
        for (text, want) in [
            ("10%", 100),
            ("10", 100),
            ("10 %", 100),
            ("2.5%", 25),
            ("0.5", 5),
            ("0", 0),
            ("0%", 0),
            ("100%", 1000),
            ("1e1%", 100),
        ] {
            assert_eq!(percent_permille(&mut ctx, &node(text), "t"), Some(want), "{text}");
        }
        assert!(!ctx.has_errors());
        for text in ["-1%", "100.1%", "2.55%", "ten", "%", "10%%", "1e9999", "10 percent"] {
            let mut ctx = Ctx::new("p.yaml");
            assert_eq!(percent_permille(&mut ctx, &node(text), "t"), None, "{text}");
            assert_eq!(ctx.into_diagnostics().len(), 1, "{text}");
        }
    }

    #[test]
    fn suggestions_catch_typos_only() {
        let known = ["name", "cohort", "department", "quotas"];
        assert_eq!(suggest("cohrt", known), Some("cohort"));
        assert_eq!(suggest("Quota", known), Some("quotas"));
        assert_eq!(suggest("gpus", known), None);
        assert_eq!(suggest("nmae", known), Some("name"));
        assert_eq!(levenshtein("abc", "abc"), 0);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("ca", "ac"), 1);
    }
}
