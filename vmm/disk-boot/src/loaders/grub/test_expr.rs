//! GRUB's `test` / `[ ... ]` (`commands/test.c`): string and integer comparisons, file
//! tests, `!`, `-a`, `-o` and parentheses. File tests ask the caller.

/// What a file test asks about a GRUB path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileTest {
    /// `-e`: exists.
    Exists,
    /// `-f`: a regular file.
    File,
    /// `-d`: a directory.
    Dir,
    /// `-s`: a file that is not empty.
    NonEmpty,
}

/// Evaluates `args` (without the closing `]`); `file` answers file tests.
pub(crate) fn eval(args: &[String], file: &mut dyn FnMut(FileTest, &str) -> bool) -> bool {
    let mut parser = Expr {
        args,
        at: 0,
        file,
        depth: 0,
    };
    let value = parser.or();
    // Words left over make GRUB's test false (it reports a syntax error).
    value && parser.at == args.len()
}

struct Expr<'a> {
    args: &'a [String],
    at: usize,
    file: &'a mut dyn FnMut(FileTest, &str) -> bool,
    depth: usize,
}

impl<'a> Expr<'a> {
    fn peek(&self, ahead: usize) -> Option<&'a str> {
        self.args.get(self.at + ahead).map(String::as_str)
    }

    fn or(&mut self) -> bool {
        let mut value = self.and();
        while self.peek(0) == Some("-o") {
            self.at += 1;
            let right = self.and();
            value = value || right;
        }
        value
    }

    fn and(&mut self) -> bool {
        let mut value = self.not();
        while self.peek(0) == Some("-a") {
            self.at += 1;
            let right = self.not();
            value = value && right;
        }
        value
    }

    fn not(&mut self) -> bool {
        // `!` followed by something is negation; a lone `!` is a non-empty string.
        if self.peek(0) == Some("!") && self.peek(1).is_some() && self.depth < 64 {
            self.at += 1;
            self.depth += 1;
            let value = !self.not();
            self.depth -= 1;
            return value;
        }
        self.primary()
    }

    fn primary(&mut self) -> bool {
        let Some(first) = self.peek(0) else {
            return false;
        };
        if first == "(" && self.depth < 64 {
            self.at += 1;
            self.depth += 1;
            let value = self.or();
            self.depth -= 1;
            if self.peek(0) == Some(")") {
                self.at += 1;
            }
            return value;
        }
        // Binary operators first: `[ -n = -n ]` compares strings.
        if let (Some(op), Some(right)) = (self.peek(1), self.peek(2))
            && let Some(value) = binary(first, op, right)
        {
            self.at += 3;
            return value;
        }
        if let Some(operand) = self.peek(1) {
            let test = match first {
                "-z" => Some(operand.is_empty()),
                "-n" => Some(!operand.is_empty()),
                "-e" => Some((self.file)(FileTest::Exists, operand)),
                "-f" => Some((self.file)(FileTest::File, operand)),
                "-d" => Some((self.file)(FileTest::Dir, operand)),
                "-s" => Some((self.file)(FileTest::NonEmpty, operand)),
                _ => None,
            };
            if let Some(value) = test {
                self.at += 2;
                return value;
            }
        }
        self.at += 1;
        !first.is_empty()
    }
}

fn binary(left: &str, op: &str, right: &str) -> Option<bool> {
    let int = |s: &str| s.trim().parse::<i64>().unwrap_or(0);
    Some(match op {
        "=" | "==" => left == right,
        "!=" => left != right,
        "<" => left < right,
        "<=" => left <= right,
        ">" => left > right,
        ">=" => left >= right,
        "-eq" => int(left) == int(right),
        "-ne" => int(left) != int(right),
        "-lt" => int(left) < int(right),
        "-le" => int(left) <= int(right),
        "-gt" => int(left) > int(right),
        "-ge" => int(left) >= int(right),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(expr: &str) -> bool {
        let args: Vec<String> = expr.split_whitespace().map(str::to_string).collect();
        eval(&args, &mut |test, path| match test {
            FileTest::Exists | FileTest::File | FileTest::NonEmpty => path == "/boot/grub/grubenv",
            FileTest::Dir => path == "/boot",
        })
    }

    #[test]
    fn the_tests_generated_configs_use() {
        assert!(t("xy = xy"));
        assert!(!t("x = xy"));
        assert!(t("-s /boot/grub/grubenv"));
        assert!(!t("-s /nothing"));
        assert!(t("-d /boot"));
        assert!(t("1 -eq 1"));
        assert!(t("2 -gt 1 -a ! 1 -gt 2"));
        assert!(t("-z x -o -n x"));
        assert!(t("( 1 = 2 -o 2 = 2 )"));
        assert!(t("nonempty"));
        assert!(!t(""));
        // `[ "$x" ]` with x empty.
        assert!(!eval(&[String::new()], &mut |_, _| true));
        assert!(!t("a = a extra"));
    }
}
