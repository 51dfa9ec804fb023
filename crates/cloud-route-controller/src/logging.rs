//! Log setup: human-readable or JSON lines; level from -v or RUST_LOG.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

pub fn init(verbose: u8, format: LogFormat) {
    let default = match verbose {
        0 => "info",
        1 => "debug,hyper=info,kube_client=info,tower=info,rustls=info",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}
