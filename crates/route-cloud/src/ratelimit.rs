//! A client-side token bucket on tokio time (virtualised under a paused clock).
