"""The server's Prometheus metrics (`GET /metrics`, as vLLM's and llama.cpp's servers expose
them): choices by API and outcome, error responses by status, prompt and generated tokens, the
prompt tokens prefix reuse spared, speculative decoding's guessed and taken tokens, and latency histograms as the client sees them (from the
request's arrival at the server, tokenizing included); the engine's running and waiting
sequences are read at each scrape. One registry per server, so servers in one process (tests)
keep their own counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# seconds: TTFT and end-to-end from tens of ms (a short chat turn) to minutes; TPOT from 1 ms
LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
OUTCOMES = ("stop", "length", "error", "cancelled")


class ServerMetrics:
    """Counters and histograms the HTTP handlers update, plus the engine's state at scrape."""

    def __init__(self, engine) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("sandwichc_requests", "Choices served, by API and outcome "
                                "(stop, length, error, cancelled: the client left)",
                                ["api", "outcome"], registry=r)
        self.errors = Counter("sandwichc_error_responses", "Requests answered with an error "
                              "status (a refused request, or a reply that failed)", ["status"],
                              registry=r)
        self.prompt_tokens = Counter("sandwichc_prompt_tokens", "Prompt tokens of the choices "
                                     "served", registry=r)
        self.generated = Counter("sandwichc_generation_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("sandwichc_time_to_first_token_seconds", "Arrival at the server "
                              "to the first token", buckets=LATENCY, registry=r)
        self.tpot = Histogram("sandwichc_time_per_output_token_seconds", "Mean gap between a "
                              "reply's tokens after the first", buckets=PER_TOKEN, registry=r)
        self.e2e = Histogram("sandwichc_e2e_request_latency_seconds", "Arrival at the server to "
                             "the last token", buckets=LATENCY, registry=r)
        r.register(_EngineState(engine))

    def served(self, api: str, outcome: str, *, prompt: int, tokens: int, arrival: float,
               first: float | None, last: float) -> None:
        """One choice ended (`first`: when its first token came, None before any)."""
        self.requests.labels(api, outcome).inc()
        self.prompt_tokens.inc(prompt)
        self.generated.inc(tokens)
        if first is None:
            return
        self.ttft.observe(first - arrival)
        self.e2e.observe(last - arrival)
        if tokens > 1:
            self.tpot.observe((last - first) / (tokens - 1))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _EngineState:
    """Read at each scrape from the engine thread's objects (plain ints and lengths)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def describe(self):
        return []  # no fixed description: collect() runs only at scrape

    def collect(self):
        eng = self.engine
        yield GaugeMetricFamily("sandwichc_requests_running", "Sequences in the batch",
                                value=eng.running)
        yield GaugeMetricFamily("sandwichc_requests_waiting", "Requests queued for a slot",
                                value=len(eng.waiting))
        kv = getattr(eng.ex, "kv", None)
        for name, attr, what in (("prefix_reused_tokens", "reused_tokens", "Prompt positions "
                                  "found in a slot instead of prefilled (kept or copied)"),
                                 ("prefix_copied_tokens", "copied_tokens", "Of those, copied "
                                  "from a running sequence's slot")):
            yield CounterMetricFamily(f"sandwichc_{name}", what, value=getattr(kv, attr, 0))
        for name, attr, what in (("spec_decode_draft_tokens", "drafted", "Tokens speculative "
                                  "decoding guessed (--speculate)"),
                                 ("spec_decode_accepted_tokens", "accepted", "Of those, tokens "
                                  "the sampler took")):
            yield CounterMetricFamily(f"sandwichc_{name}", what, value=getattr(eng.stats, attr))
