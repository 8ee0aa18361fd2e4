//! `ferrite docs`: the command reference (`docs/cli.md`), generated from the clap definitions
//! so it cannot drift from them: a test fails when the committed file is not what this prints.

/// Columns the help text is wrapped at: fixed, so the file does not depend on a terminal.
const WIDTH: usize = 100;

/// The reference of `root` and every visible subcommand, each with its full help.
pub fn cli_reference(root: clap::Command) -> String {
    let mut root = root.term_width(WIDTH);
    // Builds the tree: global options propagate, each subcommand gets its full name.
    root.build();
    let mut out = String::from(
        "# `ferrite` command reference\n\n\
         Generated from the clap definitions by `ferrite docs > docs/cli.md`; `cargo test -p \
         ferrite-cli` fails when this file is stale. Every flag of `serve`, `worker` and \
         `gateway` can also come from the environment, as `FERRITE_` and its name in upper \
         snake case.\n",
    );
    section(&root, &mut out);
    out
}

fn section(cmd: &clap::Command, out: &mut String) {
    // Environment values are this machine's, not the reference's.
    let mut shown = cmd.clone().mut_args(|a| a.hide_env_values(true));
    let name = shown.get_bin_name().unwrap_or(shown.get_name()).to_owned();
    let help = shown.render_long_help().to_string();
    out.push_str(&format!(
        "\n## `{name}`\n\n```text\n{}\n```\n",
        help.trim_end()
    ));
    // clap's own `help` subcommands say nothing the sections do not.
    let shown_subs = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help");
    for sub in shown_subs {
        section(sub, out);
    }
}
