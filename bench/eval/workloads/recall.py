"""Family `recall`: cross-turn recall of a fact stated early in the chat.

The first user turn(s) state a handful of facts (customers with order
numbers, a traveller's profile, a project's hosts and tickets, staff rooms and
extensions). Then come distractor rounds -- logs, search results, blog posts,
API listings, source files, test runs -- with the assistant's short turns in
between. The final question asks for one early fact, phrased so that the
answer is a short string to copy:

    What is the order number of Alice Park? Answer with the order number only.

and the generation line's answer_prefix starts the reply ("The order number
of Alice Park is"), so the model's next tokens are the copy itself.

Every value in a scenario is distinct and no distractor line contains a
fact's value or subject, so the only correct source is the early turn.
Scoring: "contains" -- some answer must occur in the normalized output; the
answers are the value and, for a prefixed id, its core ("ORD-48213",
"48213"), since the small model tends to drop the prefix when it copies.
"""

from __future__ import annotations

import random

import filler
import text
from common import Conversation, Task, answer_variants

FAMILY = "recall"
SYSTEM = ("You are a helpful assistant for an operations team. You can call tools. "
          "Keep answers short and copy ids, names and dates exactly.")


def _digits(rng, n):
    return str(rng.randint(10 ** (n - 1), 10 ** n - 1))


def _names(rng, n):
    firsts = rng.sample(text.FIRST_NAMES, n)
    lasts = rng.sample(text.LAST_NAMES, n)
    return [f"{a} {b}" for a, b in zip(firsts, lasts)]


def _date(rng, year):
    return f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def orders(rng):
    n = rng.randint(3, 5)
    people = _names(rng, n)
    products = rng.sample(text.PRODUCTS, n)
    cities = rng.sample(text.CITIES, n)
    ids = [f"ORD-{_digits(rng, 5)}" for _ in range(n)]
    dates = [_date(rng, 2024) for _ in range(n)]
    lines = ["I'm working through today's support queue. Please keep these orders in mind, "
             "I will need the details later:"]
    qa = []
    for p, prod, city, oid, d in zip(people, products, cities, ids, dates):
        lines.append(f"- {p}: order {oid}, a {prod}, ordered on {d}, ships to {city}.")
        qa += [
            (f"What is the order number of {p}? Answer with the order number only.", oid,
             f"The order number of {p} is"),
            (f"What did {p} order? Answer with the product only.", prod, f"{p} ordered a"),
            (f"Which city does the order of {p} ship to? Answer with the city only.", city,
             f"The order of {p} ships to"),
            (f"On what date did {p} place the order? Answer with the date only.", d,
             f"{p} placed the order on"),
        ]
    turns = ["\n".join(lines)]
    return turns, qa, people + ids + products + cities + dates, (
        f"Got it, I have noted the {n} orders with their numbers, products, dates and cities.")


def traveller(rng):
    me = _names(rng, 2)
    ff = f"FF-{_digits(rng, 7)}"
    hotel = f"HX{rng.randint(2, 9)}-{_digits(rng, 5)}"
    passport = _date(rng, rng.randint(2026, 2031))
    seat = rng.choice(["aisle seat", "window seat", "exit row seat"])
    meal = rng.choice(["vegetarian meal", "gluten-free meal", "kosher meal", "vegan meal"])
    home = rng.choice(text.CITIES)
    contact = me[1]
    article = "an" if seat[0] in "aeiou" else "a"
    turns = [
        f"Hi, I'm {me[0]}. I'm planning a work trip next month. My frequent flyer number is {ff} "
        f"and I always want {article} {seat} if possible.",
        f"A few more things for the booking: my passport expires on {passport}, my home airport is "
        f"in {home}, please request a {meal}, and my emergency contact is {contact}. The hotel "
        f"already gave me the confirmation code {hotel}.",
    ]
    qa = [
        ("What is my frequent flyer number? Answer with the number only.", ff,
         "Your frequent flyer number is"),
        ("What is my hotel confirmation code? Answer with the code only.", hotel,
         "Your hotel confirmation code is"),
        ("When does my passport expire? Answer with the date only.", passport,
         "Your passport expires on"),
        ("Who is my emergency contact? Answer with the name only.", contact,
         "Your emergency contact is"),
        ("Which seat do I prefer? Answer with the seat type only.", seat, "You prefer an"
         if seat[0] in "aeiou" else "You prefer a"),
        ("Which meal should be requested for me? Answer with the meal only.", meal,
         "You should get a"),
        ("In which city is my home airport? Answer with the city only.", home,
         "Your home airport is in"),
    ]
    return turns, qa, [ff, hotel, passport, contact, me[0], home, seat, meal], (
        "Noted. I have your frequent flyer number, passport date, seat and meal preferences, "
        "emergency contact and hotel code.")


def project(rng):
    host = f"db-stg-{rng.randint(2, 19)}.internal"
    tag = f"v{rng.randint(2, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 12)}"
    oncall = _names(rng, 1)[0]
    ticket = f"INC-{_digits(rng, 5)}"
    flag = rng.choice(["checkout_v2_rollout", "fast_invoices", "new_search_ranker", "async_exports"])
    day, hour = rng.choice(["Tuesday", "Wednesday", "Thursday"]), rng.choice(["09:00", "14:00", "16:30"])
    window = f"{day} {hour} UTC"
    bucket = f"s3://acme-{rng.choice(['backups', 'exports', 'artifacts'])}-{_digits(rng, 4)}"
    turns = [
        f"Context for this week's release: the staging database host is {host}, the release tag "
        f"is {tag}, and the on-call engineer is {oncall}. The rollout is behind the feature flag "
        f"{flag}.",
        f"Also, the incident from last week is tracked as {ticket}, the deploy window is {window}, "
        f"and backups go to {bucket}.",
    ]
    qa = [
        ("What is the staging database host? Answer with the host name only.", host,
         "The staging database host is"),
        ("What is the release tag? Answer with the tag only.", tag, "The release tag is"),
        ("Who is the on-call engineer this week? Answer with the name only.", oncall,
         "The on-call engineer this week is"),
        ("What is the ticket id of last week's incident? Answer with the ticket id only.",
         ticket, "Last week's incident is tracked as"),
        ("What is the name of the feature flag for the rollout? Answer with the flag name only.",
         flag, "The feature flag is"),
        ("Where do backups go? Answer with the bucket only.", bucket, "Backups go to"),
    ]
    return turns, qa, [host, tag, oncall, ticket, flag, bucket], (
        "Understood. I have the staging host, release tag, on-call engineer, feature flag, "
        "incident ticket, deploy window and backup bucket.")


def contacts(rng):
    n = rng.randint(3, 5)
    people = _names(rng, n)
    rooms = [f"{rng.choice('ABCDE')}-{rng.randint(100, 499)}" for _ in range(n)]
    exts = [_digits(rng, 4) for _ in range(n)]
    if len(set(rooms)) < n or len(set(exts)) < n:
        return contacts(rng)
    lines = ["For the on-site visit, here is who we are meeting and where:"]
    qa = []
    for p, r, e in zip(people, rooms, exts):
        lines.append(f"- {p} sits in room {r}, phone extension {e}.")
        qa += [(f"In which room does {p} sit? Answer with the room only.", r,
                f"{p} sits in room"),
               (f"What is the phone extension of {p}? Answer with the extension only.", e,
                f"The phone extension of {p} is")]
    return ["\n".join(lines)], qa, people + rooms + exts, (
        f"Thanks, I have the rooms and extensions of all {n} people.")


SCENARIOS = [orders, traveller, project, contacts]


def build_turns(rng: random.Random, conv: Conversation, budget: int) -> tuple[str, str, str]:
    """Adds the fact turns and distractors (about budget tokens) to conv.

    Returns (question, answer, answer_prefix). Shared with the multiagent family.
    """
    start = conv.tokens
    turns, qa, avoid, ack = rng.choice(SCENARIOS)(rng)
    question, answer, prefix = rng.choice(qa)
    for i, t in enumerate(turns):
        conv.add("user", t, intent="user: shares details")
        conv.add("assistant", ack if i == len(turns) - 1 else "Noted, go on.",
                 intent="plan: acknowledge")
    spent = conv.tokens - start
    filler.add_rounds(rng, conv, budget - spent - conv.cost(question), avoid)
    return question, answer, prefix


def generate(rng: random.Random, task_id: str, seed: int, target: int) -> Task:
    conv = Conversation()
    conv.add("system", SYSTEM)
    question, answer, prefix = build_turns(rng, conv, target - conv.tokens)
    conv.add("user", question, intent="user: asks about an earlier detail")
    return Task(task_id, FAMILY, seed, conv, 24, "answer: recall a detail from the earlier turns",
                {"family": FAMILY, "scorer": "contains", "answers": answer_variants(answer)},
                answer_prefix=prefix)
