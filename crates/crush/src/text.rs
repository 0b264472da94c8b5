//! The `crushtool -d` text format: a parser (with line/column errors) and a
//! printer producing the same text crushtool prints. A map without `tunable`
//! lines gets Ceph's legacy tunables, as crushtool does; the printer writes
//! only tunables that differ from legacy, as crushtool does.

use crate::error::{CrushError, ParseError};
use crate::map::{alg_name, Bucket, CrushMap, Device, Rule, RuleStep, Tunables, ALG_STRAW2};
use crate::weight_to_fixed;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
    column: usize,
}

fn tokenize(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for (ln, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if c == '#' {
                break;
            }
            if c.is_whitespace() {
                i += 1;
                continue;
            }
            if c == '{' || c == '}' {
                out.push(Token {
                    text: c.to_string(),
                    line: ln + 1,
                    column: i + 1,
                });
                i += 1;
                continue;
            }
            let start = i;
            while i < chars.len()
                && !chars[i].is_whitespace()
                && !matches!(chars[i], '{' | '}' | '#')
            {
                i += 1;
            }
            out.push(Token {
                text: chars[start..i].iter().collect(),
                line: ln + 1,
                column: start + 1,
            });
        }
    }
    out
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    end_line: usize,
}

impl Parser {
    fn err_at(&self, tok: Option<&Token>, expected: &str, found: Option<String>) -> ParseError {
        match tok {
            Some(t) => ParseError {
                line: t.line,
                column: t.column,
                expected: expected.to_string(),
                found: found.unwrap_or_else(|| format!("'{}'", t.text)),
            },
            None => ParseError {
                line: self.end_line,
                column: 1,
                expected: expected.to_string(),
                found: found.unwrap_or_else(|| "end of input".to_string()),
            },
        }
    }

    fn err(&self, expected: &str) -> ParseError {
        self.err_at(self.toks.get(self.pos), expected, None)
    }

    /// An error about the previous token (already consumed).
    fn err_prev(&self, expected: &str, found: String) -> ParseError {
        self.err_at(
            self.toks.get(self.pos.saturating_sub(1)),
            expected,
            Some(found),
        )
    }

    fn peek(&self) -> Option<&str> {
        self.toks.get(self.pos).map(|t| t.text.as_str())
    }

    fn next_word(&mut self, expected: &str) -> Result<String, ParseError> {
        match self.toks.get(self.pos) {
            Some(t) if t.text != "{" && t.text != "}" => {
                self.pos += 1;
                Ok(t.text.clone())
            }
            _ => Err(self.err(expected)),
        }
    }

    fn expect(&mut self, word: &str) -> Result<(), ParseError> {
        match self.toks.get(self.pos) {
            Some(t) if t.text == word => {
                self.pos += 1;
                Ok(())
            }
            _ => Err(self.err(&format!("'{word}'"))),
        }
    }

    fn int(&mut self, expected: &str) -> Result<i32, ParseError> {
        match self.toks.get(self.pos) {
            Some(t) => match t.text.parse::<i32>() {
                Ok(v) => {
                    self.pos += 1;
                    Ok(v)
                }
                Err(_) => Err(self.err(expected)),
            },
            None => Err(self.err(expected)),
        }
    }

    fn float(&mut self, expected: &str) -> Result<f32, ParseError> {
        match self.toks.get(self.pos) {
            Some(t) => match t.text.parse::<f32>() {
                Ok(v) if (0.0..65535.0).contains(&v) => {
                    self.pos += 1;
                    Ok(v)
                }
                _ => Err(self.err(expected)),
            },
            None => Err(self.err(expected)),
        }
    }
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~'))
}

const TUNABLE_NAMES: [&str; 8] = [
    "choose_local_tries",
    "choose_local_fallback_tries",
    "choose_total_tries",
    "chooseleaf_descend_once",
    "chooseleaf_vary_r",
    "chooseleaf_stable",
    "straw_calc_version",
    "allowed_bucket_algs",
];

struct Builder {
    map: CrushMap,
    /// Explicit shadow ids from `id N class C` lines.
    wanted: BTreeMap<i32, BTreeMap<i32, i32>>,
    shadows_built: bool,
    bucket_after_shadows: bool,
}

impl CrushMap {
    /// Parses crushtool text (`crushtool -d` output or a hand-written map).
    pub fn parse_text(text: &str) -> Result<CrushMap, ParseError> {
        let toks = tokenize(text);
        let end_line = text.lines().count().max(1);
        let mut p = Parser {
            toks,
            pos: 0,
            end_line,
        };
        let mut b = Builder {
            map: CrushMap::empty(Tunables::legacy()),
            wanted: BTreeMap::new(),
            shadows_built: false,
            bucket_after_shadows: false,
        };
        while let Some(word) = p.peek().map(|s| s.to_string()) {
            match word.as_str() {
                "tunable" => parse_tunable(&mut p, &mut b)?,
                "device" => parse_device(&mut p, &mut b)?,
                "type" => parse_type(&mut p, &mut b)?,
                "rule" => {
                    if !b.shadows_built {
                        let wanted = b.wanted.clone();
                        b.map
                            .populate_shadows(&wanted)
                            .map_err(|e| p.err_at(p.toks.get(p.pos), "a valid hierarchy", Some(e.to_string())))?;
                        b.shadows_built = true;
                    }
                    parse_rule(&mut p, &mut b)?
                }
                "choose_args" => {
                    return Err(p.err_at(
                        p.toks.get(p.pos),
                        "tunable, device, type, bucket or rule",
                        Some("'choose_args' (weight sets are not supported by Cairn; remove the choose_args section)".into()),
                    ))
                }
                _ => {
                    if b.map.type_id(&word).is_some() {
                        parse_bucket(&mut p, &mut b)?
                    } else {
                        return Err(p.err("'tunable', 'device', 'type', 'rule' or a bucket type name"));
                    }
                }
            }
        }
        if !b.shadows_built {
            let wanted = b.wanted.clone();
            b.map
                .populate_shadows(&wanted)
                .map_err(|e| p.err_at(None, "a valid hierarchy", Some(e.to_string())))?;
        } else if b.bucket_after_shadows {
            b.map
                .rebuild_shadows()
                .map_err(|e| p.err_at(None, "a valid hierarchy", Some(e.to_string())))?;
        }
        b.map
            .validate()
            .map_err(|e| p.err_at(None, "a valid CRUSH map", Some(e.to_string())))?;
        Ok(b.map)
    }

    /// Prints the map as `crushtool -d` does.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push_str("# begin crush map\n");
        let t = &self.tunables;
        let l = Tunables::legacy();
        let pairs = [
            (
                "choose_local_tries",
                t.choose_local_tries,
                l.choose_local_tries,
            ),
            (
                "choose_local_fallback_tries",
                t.choose_local_fallback_tries,
                l.choose_local_fallback_tries,
            ),
            (
                "choose_total_tries",
                t.choose_total_tries,
                l.choose_total_tries,
            ),
            (
                "chooseleaf_descend_once",
                t.chooseleaf_descend_once,
                l.chooseleaf_descend_once,
            ),
            (
                "chooseleaf_vary_r",
                t.chooseleaf_vary_r,
                l.chooseleaf_vary_r,
            ),
            (
                "chooseleaf_stable",
                t.chooseleaf_stable,
                l.chooseleaf_stable,
            ),
            (
                "straw_calc_version",
                t.straw_calc_version,
                l.straw_calc_version,
            ),
            (
                "allowed_bucket_algs",
                t.allowed_bucket_algs,
                l.allowed_bucket_algs,
            ),
        ];
        for (name, v, legacy) in pairs {
            if v != legacy {
                let _ = writeln!(s, "tunable {name} {v}");
            }
        }
        s.push_str("\n# devices\n");
        for (id, d) in &self.devices {
            let _ = write!(s, "device {id} {}", d.name);
            if let Some(c) = d.class.and_then(|c| self.class_name(c)) {
                let _ = write!(s, " class {c}");
            }
            s.push('\n');
        }
        s.push_str("\n# types\n");
        for (id, n) in &self.types {
            let _ = writeln!(s, "type {id} {n}");
        }
        s.push_str("\n# buckets\n");
        let mut done = vec![false; self.buckets.len()];
        for idx in 0..self.buckets.len() {
            self.print_bucket(-1 - idx as i32, &mut done, &mut s, 0);
        }
        s.push_str("\n# rules\n");
        for r in self.rules.iter().flatten() {
            let _ = writeln!(s, "rule {} {{", r.name);
            let _ = writeln!(s, "\tid {}", r.id);
            match r.rule_type {
                crate::map::RULE_TYPE_REPLICATED => s.push_str("\ttype replicated\n"),
                crate::map::RULE_TYPE_ERASURE => s.push_str("\ttype erasure\n"),
                n => {
                    let _ = writeln!(s, "\ttype {n}");
                }
            }
            let _ = writeln!(s, "\tmin_size {}", r.min_size);
            let _ = writeln!(s, "\tmax_size {}", r.max_size);
            for st in &r.steps {
                let _ = writeln!(s, "\tstep {}", self.step_text(st));
            }
            s.push_str("}\n");
        }
        s.push_str("\n# end crush map\n");
        s
    }

    fn print_bucket(&self, id: i32, done: &mut [bool], s: &mut String, depth: usize) {
        let idx = (-1 - id) as usize;
        if depth > 64 || done.get(idx).copied().unwrap_or(true) {
            return;
        }
        done[idx] = true;
        let Some(b) = self.bucket(id) else { return };
        if self.is_shadow(id) {
            return;
        }
        for &it in &b.items {
            if it < 0 {
                self.print_bucket(it, done, s, depth + 1);
            }
        }
        let type_name = self
            .type_name(b.type_id)
            .map_or_else(|| b.type_id.to_string(), |t| t.to_string());
        let _ = writeln!(s, "{type_name} {} {{", b.name);
        let _ = writeln!(s, "\tid {}\t\t# do not change unnecessarily", b.id);
        if let Some(per_class) = self.class_bucket.get(&id) {
            for (&c, &sid) in per_class {
                let _ = writeln!(
                    s,
                    "\tid {sid} class {}\t\t# do not change unnecessarily",
                    self.class_name(c).unwrap_or("?")
                );
            }
        }
        let _ = writeln!(s, "\t# weight {}", fmt_weight(b.weight));
        let _ = writeln!(s, "\talg {}", alg_name(b.alg));
        if b.hash == 0 {
            s.push_str("\thash 0\t# rjenkins1\n");
        } else {
            let _ = writeln!(s, "\thash {}", b.hash);
        }
        for (&it, &w) in b.items.iter().zip(b.weights.iter()) {
            let _ = writeln!(s, "\titem {} weight {}", self.item_label(it), fmt_weight(w));
        }
        s.push_str("}\n");
    }
}

/// A 16.16 weight as crushtool prints it (single precision, 3 decimals).
pub(crate) fn fmt_weight(w: u32) -> String {
    let f = w as f32 / 65536.0f32;
    format!("{:.3}", f)
}

fn parse_tunable(p: &mut Parser, b: &mut Builder) -> Result<(), ParseError> {
    p.expect("tunable")?;
    let name = p.next_word("a tunable name")?;
    if !TUNABLE_NAMES.contains(&name.as_str()) {
        return Err(p.err_prev(
            &format!("one of {}", TUNABLE_NAMES.join(", ")),
            format!("unknown tunable '{name}'"),
        ));
    }
    let v = p.int("a non-negative integer value")?;
    if v < 0 {
        return Err(p.err_prev("a non-negative integer value", v.to_string()));
    }
    let v = v as u32;
    let t = &mut b.map.tunables;
    match name.as_str() {
        "choose_local_tries" => t.choose_local_tries = v,
        "choose_local_fallback_tries" => t.choose_local_fallback_tries = v,
        "choose_total_tries" => t.choose_total_tries = v,
        "chooseleaf_descend_once" => t.chooseleaf_descend_once = v,
        "chooseleaf_vary_r" => t.chooseleaf_vary_r = v,
        "chooseleaf_stable" => t.chooseleaf_stable = v,
        "straw_calc_version" => t.straw_calc_version = v,
        _ => t.allowed_bucket_algs = v,
    }
    Ok(())
}

fn parse_device(p: &mut Parser, b: &mut Builder) -> Result<(), ParseError> {
    p.expect("device")?;
    let id = p.int("a device id (non-negative integer)")?;
    if !(0..crate::map::MAX_DEVICES).contains(&id) {
        return Err(p.err_prev("a device id between 0 and 16777215", id.to_string()));
    }
    let name = p.next_word("a device name")?;
    if !name_ok(&name) {
        return Err(p.err_prev(
            "a device name (letters, digits, '-', '_', '.')",
            format!("'{name}'"),
        ));
    }
    if b.map.devices.contains_key(&id) {
        return Err(p.err_prev(
            "a device id not used before",
            format!("duplicate device {id}"),
        ));
    }
    if b.map.item_id(&name).is_some() {
        return Err(p.err_prev("a unique device name", format!("duplicate name '{name}'")));
    }
    let mut class = None;
    if p.peek() == Some("class") {
        p.pos += 1;
        let c = p.next_word("a device class name")?;
        class = Some(
            b.map
                .get_or_create_class(&c)
                .map_err(|e| p.err_prev("a class name", e.to_string()))?,
        );
    }
    b.map.devices.insert(id, Device { name, class });
    Ok(())
}

fn parse_type(p: &mut Parser, b: &mut Builder) -> Result<(), ParseError> {
    p.expect("type")?;
    let id = p.int("a type id (integer)")?;
    let name = p.next_word("a type name")?;
    if !name_ok(&name) || name.parse::<i64>().is_ok() {
        return Err(p.err_prev("a type name", format!("'{name}'")));
    }
    if b.map.types.contains_key(&id) || b.map.type_id(&name).is_some() {
        return Err(p.err_prev(
            "a type not defined before",
            format!("duplicate type {id} {name}"),
        ));
    }
    b.map.types.insert(id, name);
    Ok(())
}

fn parse_bucket(p: &mut Parser, b: &mut Builder) -> Result<(), ParseError> {
    let type_word = p.next_word("a bucket type")?;
    let type_id = b.map.type_id(&type_word).unwrap_or(0);
    let name = p.next_word("a bucket name")?;
    if !name_ok(&name) || name.contains('~') {
        return Err(p.err_prev(
            "a bucket name (letters, digits, '-', '_', '.')",
            format!("'{name}'"),
        ));
    }
    if b.map.item_id(&name).is_some() {
        return Err(p.err_prev(
            "a bucket name not used before",
            format!("duplicate name '{name}'"),
        ));
    }
    p.expect("{")?;
    let mut id: Option<i32> = None;
    let mut class_ids: BTreeMap<i32, i32> = BTreeMap::new();
    let mut alg = ALG_STRAW2;
    let mut alg_tok = None;
    let mut hash = 0u8;
    let mut items: Vec<(i32, u32)> = Vec::new();
    loop {
        let tag = p
            .next_word("'id', 'alg', 'hash', 'item' or '}'")
            .or_else(|e| {
                if p.peek() == Some("}") {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            })?;
        match tag.as_str() {
            "" => {
                p.expect("}")?;
                break;
            }
            "id" => {
                let v = p.int("a negative bucket id")?;
                if v >= 0 {
                    return Err(p.err_prev("a negative bucket id", v.to_string()));
                }
                if p.peek() == Some("class") {
                    p.pos += 1;
                    let c = p.next_word("a device class name")?;
                    let cid = b
                        .map
                        .get_or_create_class(&c)
                        .map_err(|e| p.err_prev("a class name", e.to_string()))?;
                    if class_ids.insert(cid, v).is_some() {
                        return Err(p.err_prev(
                            "one id per class",
                            format!("duplicate class '{c}' for bucket '{name}'"),
                        ));
                    }
                } else {
                    id = Some(v);
                }
            }
            "alg" => {
                let a = p.next_word("a bucket algorithm")?;
                alg = match a.as_str() {
                    "straw2" => ALG_STRAW2,
                    "uniform" | "list" | "tree" | "straw" => {
                        alg_tok = Some(a.clone());
                        0
                    }
                    _ => return Err(p.err_prev("straw2", format!("'{a}'"))),
                };
                if alg == 0 {
                    return Err(p.err_prev(
                        "alg straw2",
                        CrushError::UnsupportedAlg {
                            bucket: name.clone(),
                            alg: alg_tok.unwrap_or_default(),
                        }
                        .to_string(),
                    ));
                }
            }
            "hash" => {
                let h = p.next_word("a hash (0 or rjenkins1)")?;
                if h != "0" && h != "rjenkins1" {
                    return Err(p.err_prev(
                        "hash 0 (rjenkins1, the only hash Ceph defines)",
                        format!("'{h}'"),
                    ));
                }
                hash = 0;
            }
            "item" => {
                let iname = p.next_word("an item name")?;
                let Some(iid) = b.map.item_id(&iname).filter(|&i| !b.map.is_shadow(i)) else {
                    return Err(p.err_prev(
                        "a device or bucket defined earlier in the file",
                        format!("unknown item '{iname}'"),
                    ));
                };
                let mut w = if iid >= 0 {
                    0x10000
                } else {
                    b.map.bucket(iid).map_or(0, |x| x.weight)
                };
                loop {
                    match p.peek() {
                        Some("weight") => {
                            p.pos += 1;
                            let f = p.float("a weight (non-negative number)")?;
                            w = weight_to_fixed(f64::from(f));
                        }
                        Some("pos") => {
                            return Err(p.err("'weight', 'item' or '}' ('pos' only applies to uniform/list/tree buckets)"));
                        }
                        _ => break,
                    }
                }
                items.push((iid, w));
            }
            _ => return Err(p.err_prev("'id', 'alg', 'hash', 'item' or '}'", format!("'{tag}'"))),
        }
    }
    let _ = alg;
    let id = match id {
        Some(v) => {
            if b.map.bucket(v).is_some() {
                return Err(p.err_prev(
                    "a bucket id not used before",
                    format!("bucket id {v} of '{name}' is already used"),
                ));
            }
            v
        }
        None => b.map.free_bucket_id(&|_| false),
    };
    if (-1 - id) as usize >= crate::map::MAX_BUCKETS {
        return Err(p.err_prev("a bucket id above -1048576", id.to_string()));
    }
    let mut bucket = Bucket::new(id, &name, type_id);
    bucket.hash = hash;
    for (it, w) in items {
        if it == id {
            return Err(p.err_prev(
                "items other than the bucket itself",
                format!("bucket '{name}' contains itself"),
            ));
        }
        bucket.push(it, w);
    }
    b.map
        .insert_bucket(bucket)
        .map_err(|e| p.err_prev("a valid bucket", e.to_string()))?;
    if !class_ids.is_empty() {
        b.wanted.insert(id, class_ids);
    }
    if b.shadows_built {
        b.bucket_after_shadows = true;
    }
    Ok(())
}

fn parse_rule(p: &mut Parser, b: &mut Builder) -> Result<(), ParseError> {
    p.expect("rule")?;
    let name = if p.peek() == Some("{") {
        return Err(p.err("a rule name"));
    } else {
        p.next_word("a rule name")?
    };
    if !name_ok(&name) {
        return Err(p.err_prev("a rule name", format!("'{name}'")));
    }
    if b.map.rule_id(&name).is_some() {
        return Err(p.err_prev(
            "a rule name not used before",
            format!("duplicate rule '{name}'"),
        ));
    }
    p.expect("{")?;
    let mut id = None;
    let mut rule_type = crate::map::RULE_TYPE_REPLICATED;
    let mut min_size = 1;
    let mut max_size = 10;
    let mut steps = Vec::new();
    loop {
        if p.peek() == Some("}") {
            p.pos += 1;
            break;
        }
        let tag = p.next_word("'id', 'type', 'min_size', 'max_size', 'step' or '}'")?;
        match tag.as_str() {
            "id" | "ruleset" => {
                let v = p.int("a rule id (0..65535)")?;
                if !(0..crate::map::MAX_RULES as i32).contains(&v) {
                    return Err(p.err_prev("a rule id (0..65535)", v.to_string()));
                }
                id = Some(v);
            }
            "type" => {
                let t = p.next_word("'replicated' or 'erasure'")?;
                rule_type = match t.as_str() {
                    "replicated" => crate::map::RULE_TYPE_REPLICATED,
                    "erasure" => crate::map::RULE_TYPE_ERASURE,
                    other => match other.parse::<u8>() {
                        Ok(n) => n,
                        Err(_) => {
                            return Err(
                                p.err_prev("'replicated' or 'erasure'", format!("'{other}'"))
                            )
                        }
                    },
                };
            }
            "min_size" => min_size = p.int("an integer")?,
            "max_size" => max_size = p.int("an integer")?,
            "step" => steps.push(parse_step(p, b, &name)?),
            _ => {
                return Err(p.err_prev(
                    "'id', 'type', 'min_size', 'max_size', 'step' or '}'",
                    format!("'{tag}'"),
                ))
            }
        }
    }
    let Some(id) = id else {
        return Err(p.err_prev(
            "an 'id N' line in the rule",
            format!("rule '{name}' without id"),
        ));
    };
    if b.map.rule(id).is_some() {
        return Err(p.err_prev(
            "a rule id not used before",
            format!("rule id {id} of '{name}' is already used"),
        ));
    }
    b.map
        .insert_rule(Rule {
            id,
            name,
            rule_type,
            min_size,
            max_size,
            steps,
        })
        .map_err(|e| p.err_prev("a valid rule", e.to_string()))?;
    Ok(())
}

fn parse_step(p: &mut Parser, b: &mut Builder, rule: &str) -> Result<RuleStep, ParseError> {
    let op = p.next_word("a step (take, choose, chooseleaf, emit, set_*)")?;
    let step = match op.as_str() {
        "take" => {
            let item = p.next_word("an item name")?;
            let Some(mut id) = b.map.item_id(&item).filter(|&i| !b.map.is_shadow(i)) else {
                return Err(p.err_prev("a bucket or device name", format!("unknown item '{item}' in rule '{rule}'")));
            };
            if p.peek() == Some("class") {
                p.pos += 1;
                let c = p.next_word("a device class name")?;
                let Some(cid) = b.map.class_id(&c) else {
                    return Err(p.err_prev("a defined device class", format!("class '{c}' not defined (rule '{rule}')")));
                };
                let Some(sid) = b.map.shadow_of(id, cid) else {
                    return Err(p.err_prev(
                        "a bucket with a shadow tree for the class",
                        format!("'{item}' has no class information for class '{c}'"),
                    ));
                };
                id = sid;
            }
            RuleStep::Take(id)
        }
        "choose" | "chooseleaf" => {
            let mode = p.next_word("'firstn' or 'indep'")?;
            if mode != "firstn" && mode != "indep" {
                return Err(p.err_prev("'firstn' or 'indep'", format!("'{mode}'")));
            }
            let n = p.int("a replica count (integer, 0 or negative means pool size minus it)")?;
            p.expect("type")?;
            let t = p.next_word("a type name")?;
            let Some(type_id) = b.map.type_id(&t) else {
                return Err(p.err_prev("a type defined in the map", format!("unknown type '{t}'")));
            };
            match (op.as_str(), mode.as_str()) {
                ("choose", "firstn") => RuleStep::ChooseFirstN { n, type_id },
                ("choose", _) => RuleStep::ChooseIndep { n, type_id },
                ("chooseleaf", "firstn") => RuleStep::ChooseLeafFirstN { n, type_id },
                _ => RuleStep::ChooseLeafIndep { n, type_id },
            }
        }
        "emit" => RuleStep::Emit,
        "set_choose_tries" => RuleStep::SetChooseTries(p.int("an integer")?),
        "set_chooseleaf_tries" => RuleStep::SetChooseLeafTries(p.int("an integer")?),
        "set_choose_local_tries" => RuleStep::SetChooseLocalTries(p.int("an integer")?),
        "set_choose_local_fallback_tries" => RuleStep::SetChooseLocalFallbackTries(p.int("an integer")?),
        "set_chooseleaf_vary_r" => RuleStep::SetChooseLeafVaryR(p.int("an integer")?),
        "set_chooseleaf_stable" => RuleStep::SetChooseLeafStable(p.int("an integer")?),
        other => {
            return Err(p.err_prev(
                "take, choose, chooseleaf, emit, set_choose_tries, set_chooseleaf_tries, set_choose_local_tries, set_choose_local_fallback_tries, set_chooseleaf_vary_r or set_chooseleaf_stable",
                format!("'{other}'"),
            ))
        }
    };
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_position_and_expectation() {
        let e = CrushMap::parse_text("type 0 osd\ndevice x osd.0\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 8));
        assert!(e.expected.contains("device id"), "{e}");
        let e =
            CrushMap::parse_text("type 0 osd\ntype 1 host\nhost a {\n\tid -1\n\talg straw\n}\n")
                .unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.to_string().contains("straw2"), "{e}");
        let e = CrushMap::parse_text("type 0 osd\nrule r {\n id 0\n step take nowhere\n}\n")
            .unwrap_err();
        assert_eq!((e.line, e.column), (4, 12));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 500, failure_persistence: None, ..Default::default() })]

        /// Arbitrary token soup never panics the parser; whatever parses prints
        /// text that parses again.
        #[test]
        fn parser_never_panics(words in proptest::collection::vec(proptest::sample::select(vec![
            "device", "type", "rule", "host", "root", "osd", "osd.0", "osd.1", "{", "}", "id", "-1", "-2",
            "-2147483648", "0", "1", "7", "class", "hdd", "alg", "straw2", "straw", "hash", "item", "weight",
            "1.5", "step", "take", "default", "a", "choose", "chooseleaf", "firstn", "indep", "emit",
            "tunable", "choose_total_tries", "\n", "#", "min_size", "max_size", "set_choose_tries",
        ]), 0..60)) {
            let text = words.join(" ");
            if let Ok(m) = CrushMap::parse_text(&text) {
                proptest::prop_assert!(CrushMap::parse_text(&m.to_text()).is_ok());
            }
        }
    }

    #[test]
    fn weights_print_like_crushtool() {
        assert_eq!(fmt_weight(0x10000), "1.000");
        assert_eq!(fmt_weight(357_695), "5.458");
        assert_eq!(fmt_weight(0), "0.000");
    }
}
