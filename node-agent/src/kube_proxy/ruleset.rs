//! `iptables-save` output, parsed: tables, their chains and their rules, with each
//! rule's specification kept exactly as saved so that it can be deleted again by
//! `iptables-restore` (`-D CHAIN <spec>` matches the same rule in both the legacy
//! and the nft backend).

use crate::Error;

/// The five chains netfilter creates itself; every other chain is user-defined.
pub const BUILTIN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// Whether `chain` is one of netfilter's own chains (a hook, never deleted).
pub fn is_builtin_chain(chain: &str) -> bool {
    BUILTIN_CHAINS.contains(&chain)
}

/// One `iptables-save` (or `ip6tables-save`) dump of one backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedRuleset {
    pub tables: Vec<SavedTable>,
}

/// One `*table ... COMMIT` block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedTable {
    pub name: String,
    /// Chains in the order declared (`:NAME POLICY [packets:bytes]`).
    pub chains: Vec<SavedChain>,
    /// Rules in the order saved, which within one chain is their evaluation order.
    pub rules: Vec<SavedRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedChain {
    pub name: String,
    /// The policy of a built-in chain (`ACCEPT`, `DROP`); `None` for user chains (`-`).
    pub policy: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRule {
    pub chain: String,
    /// Everything after `-A CHAIN `, verbatim (quotes included).
    pub spec: String,
}

impl SavedRuleset {
    /// Parses `iptables-save` output (with or without `-c` counters). Comments and
    /// blank lines are skipped; anything else unexpected is an error, because a
    /// cleanup planned from a misread dump could delete the wrong rules.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut tables = Vec::new();
        let mut current: Option<SavedTable> = None;
        for (index, raw_line) in text.lines().enumerate() {
            let line_number = index + 1;
            let line = raw_line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let invalid = |reason: &str| Error::ParseIptablesSave {
                line: line_number,
                reason: format!("{reason}: {line:?}"),
            };
            if let Some(name) = line.strip_prefix('*') {
                if current.is_some() {
                    return Err(invalid("table started before the previous COMMIT"));
                }
                current = Some(SavedTable {
                    name: name.trim().to_string(),
                    ..SavedTable::default()
                });
                continue;
            }
            let Some(table) = current.as_mut() else {
                return Err(invalid("line outside a table"));
            };
            if line == "COMMIT" {
                if let Some(table) = current.take() {
                    tables.push(table);
                }
                continue;
            }
            if let Some(declaration) = line.strip_prefix(':') {
                let mut words = declaration.split_whitespace();
                let (Some(name), Some(policy)) = (words.next(), words.next()) else {
                    return Err(invalid("chain declaration without a policy"));
                };
                table.chains.push(SavedChain {
                    name: name.to_string(),
                    policy: (policy != "-").then(|| policy.to_string()),
                });
                continue;
            }
            // `iptables-save -c` prefixes each rule with `[packets:bytes] `.
            let rule = match line.strip_prefix('[') {
                Some(rest) => match rest.split_once("] ") {
                    Some((_, rule)) => rule.trim_start(),
                    None => return Err(invalid("unterminated counters")),
                },
                None => line,
            };
            let Some(rest) = rule.strip_prefix("-A ") else {
                return Err(invalid("not a table, chain, rule or COMMIT line"));
            };
            let rest = rest.trim_start();
            let (chain, spec) = match rest.split_once(' ') {
                Some((chain, spec)) => (chain, spec.trim()),
                // A rule with no match and no target (`-A CHAIN`) is legal.
                None => (rest, ""),
            };
            table.rules.push(SavedRule {
                chain: chain.to_string(),
                spec: spec.to_string(),
            });
        }
        if let Some(table) = current {
            return Err(Error::ParseIptablesSave {
                line: text.lines().count(),
                reason: format!("table {} has no COMMIT", table.name),
            });
        }
        Ok(Self { tables })
    }

    pub fn table(&self, name: &str) -> Option<&SavedTable> {
        self.tables.iter().find(|table| table.name == name)
    }

    /// Whether the dump holds anything beyond empty built-in chains: a sign that the
    /// backend is in use on this node.
    pub fn has_content(&self) -> bool {
        self.tables.iter().any(|table| {
            !table.rules.is_empty() || table.chains.iter().any(|chain| chain.policy.is_none())
        })
    }
}

impl SavedTable {
    pub fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|chain| chain.name == name)
    }

    /// The rules of `chain`, in evaluation order.
    pub fn rules_of<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a SavedRule> + 'a {
        self.rules.iter().filter(move |rule| rule.chain == chain)
    }
}

impl SavedRule {
    /// The rule's words as iptables sees them (quotes removed, `\"` unescaped).
    pub fn words(&self) -> Vec<String> {
        split_words(&self.spec)
    }

    /// The chain or target the rule jumps or goes to (`-j X`, `-g X`), if any.
    pub fn target(&self) -> Option<String> {
        let words = self.words();
        words
            .iter()
            .position(|word| matches!(word.as_str(), "-j" | "--jump" | "-g" | "--goto"))
            .and_then(|index| words.get(index + 1).cloned())
    }

    /// The match modules the rule loads (`-m NAME`).
    pub fn match_modules(&self) -> Vec<String> {
        let words = self.words();
        words
            .windows(2)
            .filter(|pair| pair[0] == "-m" || pair[0] == "--match")
            .map(|pair| pair[1].clone())
            .collect()
    }

    /// The value of the rule's `--comment`, if any.
    pub fn comment(&self) -> Option<String> {
        let words = self.words();
        words
            .windows(2)
            .find(|pair| pair[0] == "--comment")
            .map(|pair| pair[1].clone())
    }

    /// The `-A` line that recreates this rule.
    pub fn append_line(&self) -> String {
        restore_line("-A", &self.chain, &self.spec)
    }

    /// The `-D` line that deletes this exact rule (the first one equal to it).
    pub fn delete_line(&self) -> String {
        restore_line("-D", &self.chain, &self.spec)
    }
}

fn restore_line(operation: &str, chain: &str, spec: &str) -> String {
    if spec.is_empty() {
        format!("{operation} {chain}")
    } else {
        format!("{operation} {chain} {spec}")
    }
}

/// Splits a saved rule into words the way `iptables-restore` does: whitespace
/// separates words, double quotes group them, and a backslash escapes a quote.
pub fn split_words(spec: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut characters = spec.chars().peekable();
    while let Some(character) = characters.next() {
        match character {
            '\\' if matches!(characters.peek(), Some('"') | Some('\\')) => {
                if let Some(escaped) = characters.next() {
                    word.push(escaped);
                }
                in_word = true;
            }
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            character if character.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            character => {
                word.push(character);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Quotes `text` for an `iptables-restore` line if it needs it.
pub fn quote_word(text: &str) -> String {
    if !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\\')
    {
        return text.to_string();
    }
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}
