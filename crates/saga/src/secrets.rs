//! Secrets read from files, as Docker (`secrets:`) and Kubernetes (a Secret volume) mount
//! them: `DATABASE_URL_FILE`, and each `KAFKA_CLIENT_<PROPERTY>_FILE`.

/// A secret file's content without the final newline `echo` or an editor leaves, which
/// is no part of the secret.
pub fn without_final_newline(content: &str) -> &str {
    content
        .strip_suffix('\n')
        .map(|c| c.strip_suffix('\r').unwrap_or(c))
        .unwrap_or(content)
}

/// The secret in the file at `path`.
pub fn read(path: &str) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|content| without_final_newline(&content).to_owned())
}

#[cfg(test)]
mod tests {
    use super::without_final_newline;

    #[test]
    fn only_one_final_line_ending_is_dropped() {
        assert_eq!(without_final_newline("pw\n"), "pw");
        assert_eq!(without_final_newline("pw\r\n"), "pw");
        assert_eq!(without_final_newline("pw"), "pw");
        assert_eq!(without_final_newline("pw\n\n"), "pw\n");
        assert_eq!(without_final_newline(" pw \n"), " pw ");
    }
}
