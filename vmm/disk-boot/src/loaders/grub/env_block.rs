//! GRUB's environment block (`grubenv`): `# GRUB Environment Block`, then `name=value`
//! lines (a backslash escapes the next character), padded with `#` to 1024 bytes. Where
//! `grub-set-default` and `grub2-editenv` keep `saved_entry`, and Fedora kept `kernelopts`.

/// The variables of a `grubenv` file, in file order. Lines that are not `name=value` (the
/// header, the padding) are skipped.
pub(crate) fn parse(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut vars = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.starts_with('#') {
            continue;
        }
        let Some((name, mut value)) = line.split_once('=') else {
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let mut out = String::new();
        // An escaped newline continues the value on the next line.
        loop {
            let mut escaped = false;
            for c in value.chars() {
                if escaped {
                    out.push(c);
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else {
                    out.push(c);
                }
            }
            match (escaped, lines.get(i)) {
                (true, Some(next)) => {
                    out.push('\n');
                    value = next;
                    i += 1;
                }
                _ => break,
            }
        }
        vars.push((name.to_string(), out));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_variables_and_skips_padding() {
        let block = format!(
            "# GRUB Environment Block\nsaved_entry=abc-6.8.5\nkernelopts=root=UUID=1 ro \\\\x\nboot_success=1\n{}",
            "#".repeat(900)
        );
        assert_eq!(
            parse(&block),
            vec![
                ("saved_entry".into(), "abc-6.8.5".into()),
                ("kernelopts".into(), "root=UUID=1 ro \\x".into()),
                ("boot_success".into(), "1".into()),
            ]
        );
    }

    #[test]
    fn an_escaped_newline_continues_the_value() {
        assert_eq!(
            parse("a=one\\\ntwo\nb=2\n"),
            vec![("a".into(), "one\ntwo".into()), ("b".into(), "2".into())]
        );
        assert!(parse("=x\nnot a var\n-a=1\n").is_empty());
    }
}
