//! GRUB's script language, read as data: words, quoting and variable references (GRUB's
//! `script/yylex.l` rules), and the statements `grub-mkconfig` writes: commands,
//! `if`/`elif`/`else`, `while`/`until`, `for`, `function`, `menuentry` and `submenu`.
//!
//! Nothing here runs anything: the parser turns text into a [`Node`] tree that the
//! interpreter in `super` walks with its own, bounded, set of commands.

use std::rc::Rc;

/// Part of a word: text, or a variable reference expanded when the command runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Text { text: String, quoted: bool },
    Var { name: String, quoted: bool },
}

/// A word: what the lexer read between separators, before expansion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) Vec<Part>);

impl Word {
    /// The word's text if it has no variables and no quotes: how keywords are recognised.
    pub(crate) fn bare(&self) -> Option<&str> {
        match self.0.as_slice() {
            [
                Part::Text {
                    text,
                    quoted: false,
                },
            ] => Some(text),
            _ => None,
        }
    }
}

/// A statement.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    /// A command and its arguments; `negate` for `! command`.
    Simple {
        words: Vec<Word>,
        negate: bool,
        line: usize,
    },
    If {
        arms: Vec<(Vec<Node>, Vec<Node>)>,
        otherwise: Option<Vec<Node>>,
    },
    Loop {
        until: bool,
        condition: Vec<Node>,
        body: Vec<Node>,
    },
    For {
        var: String,
        items: Vec<Word>,
        body: Vec<Node>,
    },
    Function {
        name: String,
        body: Rc<Vec<Node>>,
    },
    Menu {
        submenu: bool,
        args: Vec<Word>,
        body: Rc<Vec<Node>>,
        line: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(Word),
    /// Newline or `;`.
    Separator,
    Open,
    Close,
}

/// A syntax error, with its line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub(crate) struct SyntaxError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// Bounds nesting (`if` in `menuentry` in `submenu`...): generated configs nest 4 deep.
const MAX_DEPTH: usize = 64;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Splits `text` into tokens, each with its line.
fn lex(text: &str) -> Result<Vec<(Token, usize)>, SyntaxError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let error = |line, message: &str| SyntaxError {
        line,
        message: message.to_string(),
    };
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\r' => i += 1,
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                i += 2;
                line += 1;
            }
            '\n' | ';' => {
                tokens.push((Token::Separator, line));
                if c == '\n' {
                    line += 1;
                }
                i += 1;
            }
            '{' => {
                tokens.push((Token::Open, line));
                i += 1;
            }
            '}' => {
                tokens.push((Token::Close, line));
                i += 1;
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            _ => {
                let start_line = line;
                let mut parts: Vec<Part> = Vec::new();
                let mut text = String::new();
                let flush = |parts: &mut Vec<Part>, text: &mut String, quoted: bool| {
                    if !text.is_empty() {
                        parts.push(Part::Text {
                            text: std::mem::take(text),
                            quoted,
                        });
                    }
                };
                while i < chars.len() {
                    let c = chars[i];
                    match c {
                        ' ' | '\t' | '\r' | '\n' | ';' | '{' | '}' => break,
                        '\\' => {
                            match chars.get(i + 1) {
                                Some('\n') => {
                                    line += 1;
                                }
                                Some(&next) => text.push(next),
                                None => {}
                            }
                            i += 2;
                        }
                        '\'' => {
                            flush(&mut parts, &mut text, false);
                            i += 1;
                            let mut quoted = String::new();
                            loop {
                                match chars.get(i) {
                                    None => return Err(error(start_line, "unterminated '")),
                                    Some('\'') => break,
                                    Some(&q) => {
                                        if q == '\n' {
                                            line += 1;
                                        }
                                        quoted.push(q);
                                    }
                                }
                                i += 1;
                            }
                            i += 1;
                            parts.push(Part::Text {
                                text: quoted,
                                quoted: true,
                            });
                        }
                        '"' => {
                            flush(&mut parts, &mut text, false);
                            i += 1;
                            let mut quoted = String::new();
                            loop {
                                match chars.get(i) {
                                    None => return Err(error(start_line, "unterminated \"")),
                                    Some('"') => break,
                                    Some('\\') => match chars.get(i + 1) {
                                        Some('\n') => {
                                            line += 1;
                                            i += 2;
                                        }
                                        Some(&e @ ('"' | '\\' | '$')) => {
                                            quoted.push(e);
                                            i += 2;
                                        }
                                        _ => {
                                            quoted.push('\\');
                                            i += 1;
                                        }
                                    },
                                    Some('$') => match variable(&chars, i) {
                                        Some((name, next)) => {
                                            flush(&mut parts, &mut quoted, true);
                                            parts.push(Part::Var { name, quoted: true });
                                            i = next;
                                        }
                                        None => {
                                            quoted.push('$');
                                            i += 1;
                                        }
                                    },
                                    Some(&q) => {
                                        if q == '\n' {
                                            line += 1;
                                        }
                                        quoted.push(q);
                                        i += 1;
                                    }
                                }
                            }
                            i += 1;
                            // An empty "" is still a (quoted, empty) part of the word.
                            parts.push(Part::Text {
                                text: quoted,
                                quoted: true,
                            });
                        }
                        '$' => match variable(&chars, i) {
                            Some((name, next)) => {
                                flush(&mut parts, &mut text, false);
                                parts.push(Part::Var {
                                    name,
                                    quoted: false,
                                });
                                i = next;
                            }
                            None => {
                                text.push('$');
                                i += 1;
                            }
                        },
                        _ => {
                            text.push(c);
                            i += 1;
                        }
                    }
                }
                flush(&mut parts, &mut text, false);
                tokens.push((Token::Word(Word(parts)), start_line));
            }
        }
    }
    Ok(tokens)
}

/// A variable reference at `chars[at]` (a `$`): `$name`, `${name}`, `$1`, `$?`, `$#`,
/// `$@`, `$*`. Returns the name and the index after it.
fn variable(chars: &[char], at: usize) -> Option<(String, usize)> {
    let next = *chars.get(at + 1)?;
    if next == '{' {
        let end = chars[at + 2..].iter().position(|&c| c == '}')?;
        let name: String = chars[at + 2..at + 2 + end].iter().collect();
        return Some((name, at + 3 + end));
    }
    if matches!(next, '?' | '#' | '@' | '*') {
        return Some((next.to_string(), at + 2));
    }
    let len = chars[at + 1..]
        .iter()
        .take_while(|&&c| is_name_char(c))
        .count();
    (len > 0).then(|| (chars[at + 1..at + 1 + len].iter().collect(), at + 1 + len))
}

/// Parses a whole configuration. A statement with a syntax error is skipped up to the
/// next line and reported; the rest is kept (GRUB reads a configuration statement by
/// statement and carries on after an error too).
pub(crate) fn parse(text: &str) -> (Vec<Node>, Vec<SyntaxError>) {
    let tokens = match lex(text) {
        Ok(tokens) => tokens,
        Err(e) => return (Vec::new(), vec![e]),
    };
    let mut parser = Parser { tokens, at: 0 };
    let mut nodes = Vec::new();
    let mut errors = Vec::new();
    loop {
        parser.skip_separators();
        if parser.peek().is_none() {
            break;
        }
        let start = parser.at;
        match parser.statement(0) {
            Ok(Some(node)) => nodes.push(node),
            Ok(None) => {
                let line = parser.line();
                errors.push(SyntaxError {
                    line,
                    message: "unexpected token".into(),
                });
                parser.at = start + 1;
                parser.skip_line();
            }
            Err(e) => {
                errors.push(e);
                parser.at = start + 1;
                parser.skip_line();
            }
        }
    }
    (nodes, errors)
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|(t, _)| t)
    }

    fn line(&self) -> usize {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(0, |(_, l)| *l)
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, SyntaxError> {
        Err(SyntaxError {
            line: self.line(),
            message: message.into(),
        })
    }

    fn skip_separators(&mut self) {
        while self.peek() == Some(&Token::Separator) {
            self.at += 1;
        }
    }

    /// After an error: up to and including the next newline-or-`;` at any depth.
    fn skip_line(&mut self) {
        while let Some(t) = self.peek() {
            let separator = *t == Token::Separator;
            self.at += 1;
            if separator {
                break;
            }
        }
    }

    /// The keyword at the cursor, if the next token is a bare word.
    fn keyword(&self) -> Option<&str> {
        match self.peek() {
            Some(Token::Word(w)) => w.bare(),
            _ => None,
        }
    }

    fn expect_keyword(&mut self, keyword: &str) -> Result<(), SyntaxError> {
        self.skip_separators();
        if self.keyword() == Some(keyword) {
            self.at += 1;
            Ok(())
        } else {
            self.error(format!("expected {keyword:?}"))
        }
    }

    /// Statements up to (not including) one of `ends` keywords, a `}` or the end.
    fn list(&mut self, depth: usize, ends: &[&str]) -> Result<Vec<Node>, SyntaxError> {
        let mut nodes = Vec::new();
        loop {
            self.skip_separators();
            match self.peek() {
                None | Some(Token::Close) => return Ok(nodes),
                _ => {}
            }
            if self.keyword().is_some_and(|k| ends.contains(&k)) {
                return Ok(nodes);
            }
            match self.statement(depth)? {
                Some(node) => nodes.push(node),
                None => return self.error("unexpected token"),
            }
        }
    }

    /// `{ list }`.
    fn block(&mut self, depth: usize) -> Result<Vec<Node>, SyntaxError> {
        self.skip_separators();
        if self.peek() != Some(&Token::Open) {
            return self.error("expected {");
        }
        self.at += 1;
        let body = self.list(depth + 1, &[])?;
        if self.peek() != Some(&Token::Close) {
            return self.error("expected }");
        }
        self.at += 1;
        Ok(body)
    }

    fn statement(&mut self, depth: usize) -> Result<Option<Node>, SyntaxError> {
        if depth > MAX_DEPTH {
            return self.error(format!("nested more than {MAX_DEPTH} deep"));
        }
        let line = self.line();
        match self.keyword() {
            Some("if") => {
                self.at += 1;
                let mut arms = Vec::new();
                let mut otherwise = None;
                loop {
                    let condition = self.list(depth + 1, &["then"])?;
                    self.expect_keyword("then")?;
                    let body = self.list(depth + 1, &["elif", "else", "fi"])?;
                    arms.push((condition, body));
                    match self.keyword() {
                        Some("elif") => self.at += 1,
                        Some("else") => {
                            self.at += 1;
                            otherwise = Some(self.list(depth + 1, &["fi"])?);
                            self.expect_keyword("fi")?;
                            break;
                        }
                        Some("fi") => {
                            self.at += 1;
                            break;
                        }
                        _ => return self.error("expected fi"),
                    }
                }
                Ok(Some(Node::If { arms, otherwise }))
            }
            Some(k @ ("while" | "until")) => {
                let until = k == "until";
                self.at += 1;
                let condition = self.list(depth + 1, &["do"])?;
                self.expect_keyword("do")?;
                let body = self.list(depth + 1, &["done"])?;
                self.expect_keyword("done")?;
                Ok(Some(Node::Loop {
                    until,
                    condition,
                    body,
                }))
            }
            Some("for") => {
                self.at += 1;
                let var = match self.keyword() {
                    Some(name) if name.chars().all(is_name_char) => name.to_string(),
                    _ => return self.error("for needs a variable name"),
                };
                self.at += 1;
                self.expect_keyword("in")?;
                let mut items = Vec::new();
                while let Some(Token::Word(w)) = self.peek() {
                    if w.bare() == Some("do") {
                        break;
                    }
                    items.push(w.clone());
                    self.at += 1;
                }
                self.expect_keyword("do")?;
                let body = self.list(depth + 1, &["done"])?;
                self.expect_keyword("done")?;
                Ok(Some(Node::For { var, items, body }))
            }
            Some("function") => {
                self.at += 1;
                let name = match self.keyword() {
                    Some(name) => name.to_string(),
                    None => return self.error("function needs a name"),
                };
                self.at += 1;
                let body = Rc::new(self.block(depth)?);
                Ok(Some(Node::Function { name, body }))
            }
            Some(k @ ("menuentry" | "submenu")) => {
                let submenu = k == "submenu";
                self.at += 1;
                let mut args = Vec::new();
                while let Some(Token::Word(w)) = self.peek() {
                    args.push(w.clone());
                    self.at += 1;
                }
                let body = Rc::new(self.block(depth)?);
                Ok(Some(Node::Menu {
                    submenu,
                    args,
                    body,
                    line,
                }))
            }
            Some("!") => {
                self.at += 1;
                match self.simple(line)? {
                    Some(Node::Simple { words, .. }) => Ok(Some(Node::Simple {
                        words,
                        negate: true,
                        line,
                    })),
                    _ => self.error("! needs a command"),
                }
            }
            Some("then" | "elif" | "else" | "fi" | "do" | "done" | "in") => {
                self.error(format!("unexpected {:?}", self.keyword().unwrap_or("")))
            }
            _ => self.simple(line),
        }
    }

    fn simple(&mut self, line: usize) -> Result<Option<Node>, SyntaxError> {
        let mut words = Vec::new();
        while let Some(Token::Word(w)) = self.peek() {
            words.push(w.clone());
            self.at += 1;
        }
        if words.is_empty() {
            return Ok(None);
        }
        Ok(Some(Node::Simple {
            words,
            negate: false,
            line,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &str, quoted: bool) -> Part {
        Part::Text {
            text: t.into(),
            quoted,
        }
    }

    fn var(n: &str, quoted: bool) -> Part {
        Part::Var {
            name: n.into(),
            quoted,
        }
    }

    #[test]
    fn words_keep_quoting_and_variables_apart() {
        let tokens = lex("set prefix=($root)'/boot/grub'\n[ x\"${a}\" = xy ]; echo \\$x").unwrap();
        let words: Vec<Word> = tokens
            .into_iter()
            .filter_map(|(t, _)| match t {
                Token::Word(w) => Some(w),
                _ => None,
            })
            .collect();
        assert_eq!(
            words[1],
            Word(vec![
                text("prefix=(", false),
                var("root", false),
                text(")", false),
                text("/boot/grub", true)
            ])
        );
        assert_eq!(
            words[3],
            Word(vec![text("x", false), var("a", true), text("", true)])
        );
        assert_eq!(words.last().unwrap(), &Word(vec![text("$x", false)]));
    }

    #[test]
    fn comments_continuations_and_lines() {
        let tokens = lex("# comment\nlinux /vmlinuz \\\n  ro # trailing\n").unwrap();
        let lines: Vec<usize> = tokens.iter().map(|(_, l)| *l).collect();
        assert_eq!(tokens.len(), 5, "{tokens:?}"); // sep, linux, /vmlinuz, ro, sep
        assert_eq!(lines[1], 2);
        assert!(lex("echo 'open").is_err());
    }

    #[test]
    fn statements_nest() {
        let (nodes, errors) = parse(
            "if [ -s $prefix/grubenv ]; then\n  load_env\nelif true; then echo; else\n echo no\nfi\n\
             function f { set a=1 }\n\
             menuentry 'Debian' --class os $menuentry_id_option 'id-1' {\n  if [ x = x ]; then insmod ext2; fi\n  linux /vmlinuz ro\n}\n\
             for x in a b; do echo $x; done\n! false",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(nodes.len(), 5);
        match &nodes[0] {
            Node::If { arms, otherwise } => {
                assert_eq!(arms.len(), 2);
                assert!(otherwise.is_some());
            }
            other => panic!("{other:?}"),
        }
        match &nodes[2] {
            Node::Menu { args, body, .. } => {
                assert_eq!(args.len(), 5);
                assert_eq!(body.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(nodes[4], Node::Simple { negate: true, .. }));
    }

    #[test]
    fn a_broken_statement_is_skipped_and_the_rest_kept() {
        let (nodes, errors) = parse("if true; then\nfi fi\nset a=1\nmenuentry x {\n");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            nodes
                .iter()
                .any(|n| matches!(n, Node::Simple { words, .. } if words[0].bare() == Some("set")))
        );
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "if true; then\n".repeat(200) + &"fi\n".repeat(200);
        let (_, errors) = parse(&deep);
        assert!(!errors.is_empty());
    }
}
