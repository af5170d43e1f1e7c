"""Seeded filler text for the context: prose, server logs, search results,
JSON API responses, test runs, stack traces.

Every generator takes a random.Random and a token budget and builds its output
line by line, so it can stop close to the budget. `avoid` lists strings that
must not appear (a task's answer and the subject of its question): a line
that would contain one is dropped, so a distractor can never hold a second,
conflicting copy of the fact under test.
"""

from __future__ import annotations

import datetime as dt
import json
import random

from common import contains_any, est_tokens, fit_lines

FIRST_NAMES = [
    "Alice", "Bruno", "Chen", "Dana", "Elif", "Farah", "Gustavo", "Hana", "Ivan", "Jamal",
    "Keiko", "Liam", "Maya", "Nikhil", "Olga", "Pedro", "Quinn", "Rosa", "Samir", "Tara",
    "Umar", "Vera", "Wen", "Ximena", "Yusuf", "Zoe", "Aaron", "Bianca", "Carlos", "Dmitri",
    "Esther", "Felix", "Grace", "Hugo", "Ines", "Jonas", "Kara", "Lucas", "Mei", "Noah",
    "Oscar", "Priya", "Rafael", "Sofia", "Tomas", "Ulla", "Victor", "Wanda", "Yara", "Zane",
]
LAST_NAMES = [
    "Park", "Silva", "Nguyen", "Kowalski", "Yilmaz", "Haddad", "Moreno", "Sato", "Petrov",
    "Okafor", "Tanaka", "Murphy", "Levi", "Shah", "Ivanova", "Costa", "Reyes", "Lindqvist",
    "Rahman", "Bauer", "Fischer", "Garcia", "Hansen", "Ito", "Jensen", "Khan", "Lopez",
    "Meyer", "Novak", "Olsen", "Patel", "Quist", "Rossi", "Schmidt", "Torres", "Ueda",
    "Varga", "Weber", "Xu", "Young", "Zimmer", "Alvarez", "Brandt", "Cohen", "Dubois",
]
CITIES = [
    "Denver", "Lisbon", "Osaka", "Toronto", "Nairobi", "Krakow", "Austin", "Dublin", "Seoul",
    "Lyon", "Porto", "Calgary", "Bergen", "Tucson", "Valencia", "Gdansk", "Leeds", "Perth",
    "Quito", "Tallinn", "Boise", "Hamburg", "Graz", "Malmo", "Adelaide", "Cork", "Turin",
]
PRODUCTS = [
    "walnut standing desk", "ergonomic office chair", "noise cancelling headset",
    "27-inch monitor", "mechanical keyboard", "ceramic pour-over set", "trail running shoes",
    "cast iron skillet", "folding bike", "espresso grinder", "wool throw blanket",
    "cordless drill", "linen duvet cover", "camping hammock", "smart thermostat",
    "bluetooth speaker", "yoga mat", "leather backpack", "air purifier", "desk lamp",
]
SERVICES = [
    "api-gateway", "billing", "checkout", "inventory", "auth", "search", "notifications",
    "exporter", "scheduler", "payments", "catalog", "reports",
]
API_PATHS = [
    "/v1/orders", "/v1/orders/{id}", "/v1/invoices", "/v1/invoices/{id}/pdf", "/v1/users/{id}",
    "/v1/cart", "/v1/cart/items", "/v1/search", "/v1/payments", "/v1/payments/{id}/capture",
    "/v1/shipments", "/v1/reports/daily", "/v1/session", "/healthz", "/v1/catalog/{id}",
]
TEAMS = ["payments", "search", "platform", "data", "mobile", "growth", "infra", "support", "billing"]
COMPONENTS = [
    "the session cache", "the invoice renderer", "the search index", "the job scheduler",
    "the config loader", "the rate limiter", "the export pipeline", "the notification service",
    "the checkout flow", "the audit log", "the feature flag service", "the image resizer",
]
TECH = [
    "Postgres 16", "a Redis cluster", "Kafka", "a gRPC gateway", "a columnar store",
    "a managed queue", "an object store", "a sidecar proxy", "a read replica", "SQLite",
]
METRICS = [
    "p99 latency", "the error rate", "memory use", "cold-start time", "build time",
    "the number of on-call pages", "disk usage", "queue depth", "the retry rate",
]
CAUSES = [
    "a missing index", "connection pool exhaustion", "a retry storm", "clock skew between hosts",
    "an unbounded cache", "a race in the shutdown path", "a misconfigured timeout",
    "a slow DNS resolver", "a leaked file handle", "an oversized batch",
]
ACTIONS = [
    "add a circuit breaker", "cap the batch size", "move the work to a background queue",
    "pin the dependency", "add a composite index", "shard the table by tenant",
    "raise the pool size", "add jitter to the retries", "stream the response",
    "precompute the totals overnight", "drop the unused column",
]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]
TOPICS = [
    "Migrating {component} to {tech}", "What we learned running {tech} in production",
    "Postmortem: {component} outage", "Quarterly notes from the {team} team",
    "Design review: {component}", "A field guide to {metric}",
]

SENTENCES = [
    "The {team} team moved {component} to {tech} in {month}, which cut {metric} by {pct} percent.",
    "Most of the trouble came from {cause}, and the fix was to {action}.",
    "Before the change, {component} handled about {n} requests a second at peak.",
    "Nobody noticed {cause} until {metric} doubled during the {month} sale.",
    "We decided to {action} first, because it was cheap and easy to roll back.",
    "{first} from the {team} team wrote most of the runbook for {component}.",
    "The dashboards now show {metric} next to the deploy markers, so regressions stand out.",
    "A second option was to {action}, but it needed a schema change we were not ready for.",
    "Load tests with {n} simulated clients reproduced the problem within minutes.",
    "After the rollout, {metric} stayed flat for {days} days in a row.",
    "The old design assumed that {component} would never see more than {n} items in a batch.",
    "Alerts fire when {metric} stays above the threshold for more than {mins} minutes.",
    "The review asked us to document why we did not simply {action}.",
    "{tech} was chosen over the alternatives mostly for its operational simplicity.",
    "In staging, {cause} showed up only when two deploys overlapped.",
    "The migration ran in {days} small steps, each one reversible.",
    "We still see occasional spikes, most likely caused by {cause}.",
    "Capacity planning for next year assumes {pct} percent growth in traffic.",
    "The {team} team owns the alerts, and the {team2} team owns the dashboards.",
    "Feature flags let us enable the new path for {pct} percent of tenants at a time.",
    "It took {days} days to backfill the historical data.",
    "Each shard now holds roughly {n} tenants, which keeps rebalancing fast.",
    "A follow-up ticket tracks the remaining work on {component}.",
    "The on-call guide now explains how to {action} without paging the whole team.",
]


def fill_sentence(rng: random.Random, template: str) -> str:
    team, team2 = rng.sample(TEAMS, 2)
    return template.format(
        team=team, team2=team2, component=rng.choice(COMPONENTS), tech=rng.choice(TECH),
        metric=rng.choice(METRICS), cause=rng.choice(CAUSES), action=rng.choice(ACTIONS),
        month=rng.choice(MONTHS), pct=rng.choice([5, 12, 18, 25, 30, 40, 60]),
        n=rng.choice([120, 450, 800, 1500, 3200, 12000]), days=rng.choice([3, 5, 9, 14, 21]),
        mins=rng.choice([2, 5, 10, 15]), first=rng.choice(FIRST_NAMES))


def paragraph(rng: random.Random, avoid: list[str] = ()) -> str:
    out = []
    for template in rng.sample(SENTENCES, rng.randint(4, 7)):
        s = fill_sentence(rng, template)
        if not contains_any(s, avoid):
            out.append(s[0].upper() + s[1:])
    return " ".join(out)


def article(rng: random.Random, budget: int, avoid: list[str] = ()) -> str:
    """A blog post or design note: a title and paragraphs."""
    title = fill_sentence(rng, rng.choice(TOPICS))
    lines = [title[0].upper() + title[1:], ""]
    used = est_tokens(title)
    while used < budget:
        p = paragraph(rng, avoid)
        lines += [p, ""]
        used += est_tokens(p) + 4
    return fit_lines(lines, budget, keep_head=3).rstrip()


def hexid(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def request_id(rng: random.Random) -> str:
    return "req-" + hexid(rng)


def timestamps(rng: random.Random, start: dt.datetime | None = None):
    t = start or dt.datetime(2024, rng.randint(1, 12), rng.randint(1, 28),
                             rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
    while True:
        t += dt.timedelta(milliseconds=rng.randint(3, 2500))
        yield t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def log_line(rng: random.Random, ts: str, service: str, status: int | None = None,
             rid: str | None = None) -> str:
    """One access or application log line; status None means an info/debug line."""
    if status is None:
        msg = rng.choice([
            "cache refresh finished keys={n}", "pool stats active={k} idle={j} waiting=0",
            "config reloaded version={k}", "scheduled job tick queue_depth={k}",
            "gc pause {k}ms", "flushed {n} metrics to collector", "lease renewed shard={k}",
        ]).format(n=rng.randint(100, 9000), k=rng.randint(1, 60), j=rng.randint(0, 20))
        return f"{ts} {rng.choice(['INFO ', 'DEBUG'])} {service} {msg}"
    path = rng.choice(API_PATHS).replace("{id}", str(rng.randint(1000, 99999)))
    method = "GET" if "pdf" in path or "search" in path else rng.choice(["GET", "GET", "POST", "PUT"])
    level = "ERROR" if status >= 500 else ("WARN " if status >= 400 else "INFO ")
    ms = rng.randint(4, 180) if status < 500 else rng.randint(900, 30000)
    return (f"{ts} {level} {service} req={rid or request_id(rng)} {method} {path} "
            f"status={status} dur={ms}ms")


def server_log(rng: random.Random, budget: int, service: str | None = None,
               avoid: list[str] = (), ok_only: bool = True, min_lines: int = 0) -> list[str]:
    """Log lines for budget tokens (at least min_lines); no 5xx unless ok_only is False."""
    service = service or rng.choice(SERVICES)
    ts = timestamps(rng)
    lines, used = [], 0
    while True:
        r = rng.random()
        if r < 0.25:
            line = log_line(rng, next(ts), service)
        else:
            status = rng.choice([200, 200, 200, 200, 201, 204, 304, 404, 409])
            if not ok_only and rng.random() < 0.05:
                status = rng.choice([500, 502, 504])
            line = log_line(rng, next(ts), service, status)
        if contains_any(line, avoid):
            continue
        cost = est_tokens(line) + 2
        if used + cost > budget and len(lines) >= min_lines:
            return lines
        lines.append(line)
        used += cost


def search_results(rng: random.Random, budget: int, avoid: list[str] = ()) -> tuple[str, str]:
    """(query, results) for a web or knowledge-base search."""
    component = rng.choice(COMPONENTS).replace("the ", "")
    query = f"{component} {rng.choice(['timeout', 'latency', 'retry policy', 'migration', 'config'])}"
    lines = [f'Search results for "{query}":', ""]
    used = est_tokens(lines[0])
    i = 1
    while True:
        title = fill_sentence(rng, rng.choice(TOPICS))
        if contains_any(title, avoid):
            continue
        slug = "-".join(title.lower().replace(":", "").split()[:6])
        entry = [f"{i}. {title[0].upper() + title[1:]}",
                 f"   https://{rng.choice(['docs', 'wiki', 'blog', 'kb'])}.example.com/{slug}",
                 f"   {paragraph(rng, avoid)}", ""]
        size = sum(est_tokens(l) + 2 for l in entry)
        if used + size > budget and i > 1:
            break
        lines += entry
        used += size
        i += 1
    return query, "\n".join(lines).rstrip()


def json_records(rng: random.Random, budget: int, avoid: list[str] = (),
                 kind: str | None = None) -> tuple[str, str]:
    """(endpoint, body) of a paginated JSON API response, one record a line."""
    kind = kind or rng.choice(["invoices", "users", "shipments", "deployments"])
    records = []
    used = 25
    while True:
        if kind == "invoices":
            r = {"id": f"INV-{rng.randint(10000, 99999)}",
                 "customer": f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}",
                 "amount": round(rng.uniform(12, 4000), 2), "currency": rng.choice(["USD", "EUR", "GBP"]),
                 "status": rng.choice(["paid", "paid", "open", "void"])}
        elif kind == "users":
            first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
            r = {"id": f"u_{hexid(rng, 6)}", "name": f"{first} {last}",
                 "email": f"{first.lower()}.{last.lower()}@example.com",
                 "plan": rng.choice(["free", "team", "enterprise"]), "active": rng.random() < 0.8}
        elif kind == "shipments":
            r = {"id": f"SHP-{rng.randint(100000, 999999)}", "carrier": rng.choice(["UPS", "DHL", "FedEx"]),
                 "destination": rng.choice(CITIES), "weight_kg": round(rng.uniform(0.2, 30), 1),
                 "state": rng.choice(["in_transit", "delivered", "label_created"])}
        else:
            r = {"id": f"dep-{rng.randint(1000, 9999)}", "service": rng.choice(SERVICES),
                 "version": f"v{rng.randint(1, 4)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
                 "region": rng.choice(["us-east-1", "eu-west-1", "ap-south-1"]),
                 "healthy": rng.random() < 0.9}
        line = json.dumps(r)
        if contains_any(line, avoid):
            continue
        cost = est_tokens(line) + 3
        if used + cost > budget and records:
            break
        records.append(line)
        used += cost
    body = ('{"data": [\n  ' + ",\n  ".join(records) +
            f'\n], "page": {rng.randint(1, 9)}, "has_more": true}}')
    return f"GET /v1/{kind}?limit={len(records)}", body


PY_MODULES = ["billing", "orders", "catalog", "auth", "reports", "shipping", "pricing", "users"]
PY_WORDS = [
    "total", "rounding", "currency", "discount", "tax", "refund", "coupon", "invoice", "cart",
    "session", "token", "export", "import", "parse", "render", "retry", "timeout", "cache",
    "merge", "split", "empty", "unicode", "negative", "large", "zero", "duplicate", "expired",
]


def test_names(rng: random.Random, n: int, avoid: list[str] = ()) -> list[tuple[str, str]]:
    """n distinct (file, test function) pairs."""
    seen, out = {}, []
    while len(out) < n:
        mod = rng.choice(PY_MODULES)
        words = rng.sample(PY_WORDS, rng.randint(2, 3))
        name = "test_" + "_".join(words)
        if name in seen or contains_any(name, avoid):
            continue
        seen[name] = True
        out.append((f"tests/test_{mod}.py", name))
    return out


def _banner(title: str) -> str:
    return f" {title} ".center(80, "=")


def pytest_run(rng: random.Random, num_tests: int, failing: tuple[str, str] | None,
               failure_body: list[str] = (), avoid: list[str] = ()) -> str:
    tests = test_names(rng, num_tests, list(avoid) + ([failing[1]] if failing else []))
    if failing:
        tests.insert(rng.randrange(len(tests) // 2, len(tests) + 1), failing)
    lines = ["$ python -m pytest -v", _banner("test session starts"),
             "platform linux -- Python 3.11.7, pytest-8.2.1, pluggy-1.5.0",
             f"collected {len(tests)} items", ""]
    for i, (path, name) in enumerate(tests):
        status = "FAILED" if failing and name == failing[1] else "PASSED"
        pct = (i + 1) * 100 // len(tests)
        lines.append(f"{path}::{name} {status} [{pct:3d}%]")
    if failing:
        lines += ["", _banner("FAILURES"),
                  f"_______________________ {failing[1]} _______________________", *failure_body, "",
                  _banner("short test summary info"),
                  f"FAILED {failing[0]}::{failing[1]}",
                  _banner(f"1 failed, {len(tests) - 1} passed in {rng.uniform(2, 40):.2f}s")]
    else:
        lines.append(_banner(f"{len(tests)} passed in {rng.uniform(2, 40):.2f}s"))
    return "\n".join(lines)


JAVA_PACKAGES = ["com.acme.billing", "com.acme.orders", "com.acme.ledger", "com.acme.sync", "com.acme.auth"]
JAVA_CLASSES = [
    "LedgerService", "InvoiceRepository", "OrderController", "PaymentClient", "RetryPolicy",
    "SessionStore", "ExportJob", "TaxCalculator", "ShipmentMapper", "AuditWriter", "CartService",
    "PriceResolver", "TokenVerifier", "BatchScheduler", "ReportBuilder",
]
JAVA_METHODS = ["apply", "load", "resolve", "post", "handle", "flush", "compute", "render", "sync", "verify"]
JAVA_EXCEPTIONS = [
    "java.lang.IllegalStateException", "java.lang.NullPointerException",
    "java.util.ConcurrentModificationException", "java.lang.ArithmeticException",
    "java.io.UncheckedIOException", "java.lang.IndexOutOfBoundsException",
]
FRAMEWORK_FRAMES = [
    "org.springframework.web.servlet.FrameworkServlet.service(FrameworkServlet.java:897)",
    "org.apache.catalina.core.ApplicationFilterChain.doFilter(ApplicationFilterChain.java:166)",
    "java.base/java.util.concurrent.ThreadPoolExecutor.runWorker(ThreadPoolExecutor.java:1136)",
    "java.base/java.util.concurrent.ThreadPoolExecutor$Worker.run(ThreadPoolExecutor.java:635)",
    "java.base/java.lang.Thread.run(Thread.java:840)",
]


def java_trace(rng: random.Random, exception: str, depth: int = 8) -> tuple[str, str]:
    """(stack trace, 'File.java:line' of the frame that threw)."""
    classes = rng.sample(JAVA_CLASSES, min(depth, len(JAVA_CLASSES)))
    frames = []
    for cls in classes[:max(3, depth - 3)]:
        line = rng.randint(40, 640)
        frames.append((f"{rng.choice(JAVA_PACKAGES)}.{cls}.{rng.choice(JAVA_METHODS)}", f"{cls}.java", line))
    msg = {
        "java.lang.IllegalStateException": "ledger entry already closed",
        "java.lang.NullPointerException": 'Cannot invoke "String.length()" because "code" is null',
        "java.util.ConcurrentModificationException": "null",
        "java.lang.ArithmeticException": "/ by zero",
        "java.io.UncheckedIOException": "java.net.SocketTimeoutException: Read timed out",
        "java.lang.IndexOutOfBoundsException":
            f"Index {rng.randint(3, 40)} out of bounds for length {rng.randint(1, 3)}",
    }[exception]
    lines = [f"{exception}: {msg}"]
    lines += [f"\tat {m}({f}:{ln})" for m, f, ln in frames]
    lines += [f"\tat {fr}" for fr in rng.sample(FRAMEWORK_FRAMES, 3)]
    return "\n".join(lines), f"{frames[0][1]}:{frames[0][2]}"


PY_EXCEPTIONS = [
    ("KeyError", "'currency'"), ("ZeroDivisionError", "division by zero"),
    ("TypeError", "unsupported operand type(s) for +: 'int' and 'NoneType'"),
    ("ValueError", "invalid literal for int() with base 10: '3.5'"),
    ("AttributeError", "'NoneType' object has no attribute 'items'"),
    ("IndexError", "list index out of range"),
]


def python_failure(rng: random.Random, test: tuple[str, str], exc: tuple[str, str]) -> tuple[list[str], str]:
    """The pytest failure section of test, and the 'path:line' that raised."""
    mod = test[0].split("test_")[-1].removesuffix(".py")
    src = f"src/{mod}/{rng.choice(['core', 'rules', 'models', 'service', 'utils'])}.py"
    line = rng.randint(20, 480)
    fn = rng.choice(["compute_total", "apply_rules", "load_items", "render_row", "merge_lines"])
    where = f"{src}:{line}"
    body = [
        "",
        f"    def {test[1]}():",
        f"        order = make_order(items={rng.randint(1, 9)})",
        f">       assert {fn}(order) == expected",
        "",
        f"{test[0]}:{rng.randint(10, 200)}: ",
        "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _",
        "",
        f"    def {fn}(order):",
        "        rows = order.rows()",
        '>       return sum(r["amount"] for r in rows) / order.count',
        f"E       {exc[0]}: {exc[1]}",
        "",
        f"{where}: {exc[0]}",
    ]
    return body, where
