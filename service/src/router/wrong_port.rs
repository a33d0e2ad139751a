//! What a listener answers a call of a service it does not serve: which
//! of metropolisd's ports this is, and on which one the service asked for
//! is, so a client pointed at the wrong port (an agent at the Curator
//! port, metroctl at the AgentCallback port) is told where to go instead
//! of a bare Unimplemented.

use metropolis_core::quote::quoted;

/// One of metropolisd's listeners, by the services it serves.
struct Listener {
    /// What people call it ("the Curator port").
    name: &'static str,
    /// The daemon's flag that places it.
    flag: &'static str,
    /// Where it is by default, and how it is reached.
    default: &'static str,
    /// What it serves, as said to a caller asking for one of them.
    serves: &'static str,
    /// The proto names (or name prefixes) of its services.
    services: &'static [&'static str],
}

const LISTENERS: [Listener; 3] = [
    Listener {
        name: "Curator",
        flag: "--listen",
        default: "default port 7835",
        serves: "the Curator and management services are",
        services: &["metropolis.node.core.curator."],
    },
    Listener {
        name: "AgentCallback",
        flag: "--agent-listen",
        default: "default port 7836",
        serves: "the AgentCallback service is",
        services: &["cloud.bmaas.server.api.AgentCallback"],
    },
    Listener {
        name: "debug",
        flag: "--debug-listen",
        default: "default port 7837, plain HTTP/2 without TLS",
        serves: "NodeDebugService is",
        services: &["metropolis.proto.api.NodeDebugService"],
    },
];

fn listener_of(service: &str) -> Option<&'static Listener> {
    LISTENERS
        .iter()
        .find(|l| l.services.iter().any(|s| service.starts_with(s)))
}

/// The Unimplemented message for a call of `service` (from the path
/// `/service/Method`) on a listener holding the services `held`.
pub(crate) fn no_service_here<'a>(
    service: &str,
    held: impl IntoIterator<Item = &'a str>,
) -> String {
    let here = held.into_iter().find_map(listener_of);
    let this = here.map(|l| format!("this is the {} port (metropolisd {})", l.name, l.flag));
    match (listener_of(service), this) {
        (Some(there), Some(this)) if here.is_some_and(|h| !std::ptr::eq(h, there)) => format!(
            "{this}; {} on {} ({})",
            there.serves, there.flag, there.default
        ),
        (_, Some(this)) => format!("no service {} here: {this}", quoted(service)),
        (_, None) => format!("no service {} here", quoted(service)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: &str = "cloud.bmaas.server.api.AgentCallback";
    const CURATOR: &str = "metropolis.node.core.curator.proto.api.Curator";
    const MACHINES: &str = "metropolis.node.core.curator.proto.private.MachineManagement";
    const DEBUG: &str = "metropolis.proto.api.NodeDebugService";

    #[test]
    fn each_port_says_what_it_is_and_where_the_service_is() {
        assert_eq!(
            no_service_here(CURATOR, [AGENT]),
            "this is the AgentCallback port (metropolisd --agent-listen); the Curator and \
             management services are on --listen (default port 7835)"
        );
        assert_eq!(
            no_service_here(AGENT, [CURATOR, MACHINES]),
            "this is the Curator port (metropolisd --listen); the AgentCallback service is on \
             --agent-listen (default port 7836)"
        );
        assert_eq!(
            no_service_here(DEBUG, [MACHINES]),
            "this is the Curator port (metropolisd --listen); NodeDebugService is on \
             --debug-listen (default port 7837, plain HTTP/2 without TLS)"
        );
        assert_eq!(
            no_service_here(MACHINES, [DEBUG]),
            "this is the debug port (metropolisd --debug-listen); the Curator and management \
             services are on --listen (default port 7835)"
        );
    }

    #[test]
    fn unknown_services_are_quoted_and_bounded() {
        let long = "x".repeat(500);
        let said = no_service_here(&long, [AGENT]);
        assert!(
            said.starts_with("no service \"xxx")
                && said
                    .ends_with("here: this is the AgentCallback port (metropolisd --agent-listen)"),
            "{said}"
        );
        assert!(said.len() < 200, "{said}");
        // A curator service missing from the Curator port (an older
        // daemon): no advice to go elsewhere.
        let said = no_service_here("metropolis.node.core.curator.proto.api.Future", [CURATOR]);
        assert_eq!(
            said,
            "no service \"metropolis.node.core.curator.proto.api.Future\" here: this is the \
             Curator port (metropolisd --listen)"
        );
        assert_eq!(
            no_service_here("a.B", std::iter::empty()),
            "no service \"a.B\" here"
        );
    }
}
