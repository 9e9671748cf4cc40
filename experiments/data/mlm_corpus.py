"""The embedded MLM corpus: generated English-like documents with long-range structure.

Every document is a deterministic function of `(seed, index)` (its own `random.Random`, seeded
with a string of the generator version, the seed and the index), so any document can be made
alone, in any order, on any machine, and the corpus has as many documents as one asks for.
Only `Random.random()` is drawn from (Python guarantees its sequence for a given seed), so the
text does not change with the Python version.

What a document is made of (one line of text, no newline; sentences end with ". "):

1. **Opening.** A town (a made-up name) and a topic (harbor, farm, workshop, library,
   observatory, kitchen, forest, market). The topic fixes the lexicon of the whole document:
   its places, objects, adjectives, actions, professions and ambient sentences.
2. **Cast.** 2-5 people, each introduced once with a made-up first and family name (drawn
   from syllables, so names are new in every document and cannot be memorised), a gender
   (he/she: pronouns agree with it everywhere), a profession, a home town (another made-up
   name), an age, a colour and an object they keep, and a pet (an animal with a made-up name).
3. **Facts.** 2-3 key-value facts: a four-digit code of a topic object, the weekday of an
   event, the colour of a door.
4. **Inventory (nested list with counting).** A place with 2-4 shelves, each holding a number
   (in words) of one topic object, and the total written out ("Altogether the shelves hold
   seventeen things."); a task list whose second item has sub-items ("first, ...; second, ...,
   which has two parts: ... and ...; third, ...").
5. **Body** (paragraphs of 3-6 sentences, until the document reaches its target length):
   visits to the topic's places with an ordinal that counts that person's earlier visits to
   that place anywhere in the document ("It was her third visit to the pier."); meetings that
   restate a person's profession and home town; the pet by name; the object kept; the age;
   questions about a fact answered with its value; things taken from a shelf with the number
   left ("so four crates remained there": needs the count from the inventory and every earlier
   removal); tasks of the list referred to by their position; topic sentences (ambient text
   in the topic's lexicon). Pronouns and a/an, singular/plural and number words agree.
6. **Closing.** Every person again in order of introduction with profession, home town, pet
   and how many times they visited each place (counted over the whole body), and every fact
   with its value.

Why it rewards long context: most content tokens are predictable only from far away. A masked
name, home town, pet name, age, colour, code or weekday is determined by the opening or the
facts, hundreds of tokens before (or, bidirectionally, by the closing, hundreds after); visit
ordinals, objects left on a shelf and the closing's visit counts need counting over the whole
document; the topic, inferable from any paragraph, predicts the lexicon everywhere. Local
syntax (templates, agreement) is learnable from short windows, so accuracy should rise with
the context a model can use, and keep rising past the training length only if the model
extrapolates: a model trained on 128-token rows and evaluated on 512-token rows can use
restatements it never saw that far apart.

Lengths: each document draws a target of `min_chars..max_chars` characters (default
1000..3000, about 220..650 WordPiece tokens); the body stops once the text plus the closing
would reach it, so a document can exceed the target by about one paragraph, and short targets
still get the opening, cast, facts and closing (at least about 600 characters).

API: `generate_document(index, seed=)` (text and its facts, for tests and analysis),
`iter_documents(num_documents, seed=, start=)` (texts), `write_corpus(path, num_documents,
seed=)` (one document per line). CLI: `python -m experiments.data.mlm_corpus --out FILE
--num_documents N [--seed S]`.
"""

import argparse
import dataclasses
import os
import random
import tempfile
import time

GENERATOR_VERSION = 1  # bump whenever the text changes (part of every document's seed)

# --------------------------------------------------------------------------------------------
# Lexicon
# --------------------------------------------------------------------------------------------

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "st", "th", "sh", "ch", "h", "j", "w", "tr", "fl", "sk")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "l", "r", "s", "m", "k", "th", "nd", "rt")
_FAMILY_ENDINGS = ("son", "ova", "ini", "berg", "ley", "ard", "ez", "ski", "dottir", "ton")
_TOWN_ENDINGS = ("ford", "holm", "vale", "mere", "wick", "by", "stead", "port", "haven",
                 "field")

_ANIMALS = ("cat", "dog", "goat", "parrot", "rabbit", "horse", "owl", "tortoise", "ferret",
            "donkey", "hedgehog", "crow")
_COLOURS = ("red", "blue", "green", "yellow", "grey", "white", "black", "orange", "purple",
            "brown", "silver", "golden")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_TIMES = ("morning", "afternoon", "evening", "early morning", "late evening")
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
            "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
            "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
             "ninth", "tenth", "eleventh", "twelfth")


@dataclasses.dataclass(frozen=True)
class _Topic:
    name: str
    description: str  # "a town of ..."
    places: tuple  # singular nouns, used with "the"
    nouns: tuple  # objects (regular plurals via _plural)
    adjectives: tuple
    actions: tuple  # past-tense transitive verbs
    professions: tuple
    events: tuple  # things that take place on a weekday
    tasks: tuple  # imperative task phrases
    ambient: tuple  # whole sentences (the topic's "filler")


_TOPICS = (
    _Topic(
        "harbor", "a town of fishing boats and salt",
        ("pier", "boathouse", "lighthouse", "fish market", "dock"),
        ("net", "rope", "crate", "anchor", "sail", "oar", "buoy", "lantern", "barrel", "hook",
         "bucket", "compass"),
        ("wet", "salty", "heavy", "tarred", "weathered", "sturdy", "coiled", "rusty", "narrow",
         "old"),
        ("mended", "coiled", "loaded", "painted", "tied", "checked", "carried", "scrubbed"),
        ("fisher", "sailor", "boatwright", "harbor pilot", "net maker", "fishmonger"),
        ("fish auction", "boat race", "harbor festival", "tide count"),
        ("mend the torn nets", "paint the hull", "check the tide tables", "coil the ropes",
         "clean the lanterns", "count the crates"),
        ("The tide came in slowly over the stones.", "Gulls circled above the masts.",
         "A cold wind blew in from the sea.", "The boats rocked against the dock.",
         "Salt spray covered the windows of the boathouse.",
         "Far out, a foghorn sounded twice.")),
    _Topic(
        "farm", "a village of fields and orchards",
        ("barn", "orchard", "meadow", "stable", "granary"),
        ("basket", "fence", "plough", "wagon", "seed", "bale", "pail", "shovel", "hoe", "apple",
         "ladder", "sack"),
        ("muddy", "golden", "ripe", "dry", "dusty", "green", "wooden", "heavy", "small",
         "broken"),
        ("harvested", "planted", "carried", "stacked", "repaired", "watered", "sorted",
         "loaded"),
        ("farmer", "shepherd", "beekeeper", "miller", "orchard keeper", "stable hand"),
        ("harvest fair", "sheep market", "seed exchange", "plough contest"),
        ("repair the fence", "sort the apples", "feed the goats", "stack the bales",
         "sharpen the scythe", "water the seedlings"),
        ("The wheat moved in waves under the wind.", "Rain had softened the fields.",
         "Bees hummed over the clover.", "The smell of hay filled the barn.",
         "A rooster crowed behind the granary.", "Clouds gathered over the orchard.")),
    _Topic(
        "workshop", "a town of forges and workbenches",
        ("forge", "workshop", "tool shed", "sawmill", "foundry"),
        ("hammer", "chisel", "plank", "nail", "bolt", "saw", "file", "clamp", "hinge", "lever",
         "wrench", "spring"),
        ("sharp", "bent", "polished", "iron", "brass", "rough", "smooth", "hot", "long",
         "tiny"),
        ("sharpened", "welded", "polished", "measured", "filed", "assembled", "sanded",
         "tightened"),
        ("carpenter", "blacksmith", "clockmaker", "joiner", "locksmith", "toolmaker"),
        ("guild meeting", "tool fair", "apprentice exam", "furnace lighting"),
        ("sharpen the chisels", "oil the hinges", "sort the bolts", "sweep the sawdust",
         "repair the bellows", "measure the planks"),
        ("Sparks flew from the anvil.", "The smell of sawdust hung in the air.",
         "A hammer rang somewhere down the street.", "The furnace glowed a deep orange.",
         "Shavings curled on the floor of the workshop.", "The old saw screeched on a knot.")),
    _Topic(
        "library", "a town of archives and reading rooms",
        ("reading room", "archive", "map room", "bindery", "catalogue hall"),
        ("book", "scroll", "ledger", "map", "folio", "quill", "ink pot", "shelf", "index card",
         "atlas", "letter", "journal"),
        ("dusty", "leather", "ancient", "rare", "faded", "bound", "fragile", "thick", "quiet",
         "forgotten"),
        ("catalogued", "copied", "repaired", "shelved", "read", "indexed", "bound", "dusted"),
        ("librarian", "archivist", "scribe", "bookbinder", "translator", "cartographer"),
        ("reading night", "book auction", "lecture", "archive tour"),
        ("index the letters", "repair the bindings", "copy the old maps",
         "dust the top shelves", "sort the journals", "label the scrolls"),
        ("The reading room was silent except for turning pages.",
         "Dust floated in the light from the tall windows.",
         "The smell of old paper filled the archive.", "Somebody whispered behind the stacks.",
         "A clock ticked above the catalogue hall.", "Rain tapped on the glass roof.")),
    _Topic(
        "observatory", "a town on a hill under clear skies",
        ("observatory", "dome", "star chart room", "instrument hall", "rooftop"),
        ("telescope", "lens", "star chart", "mirror", "notebook", "tripod", "clock", "globe",
         "prism", "candle", "logbook", "sextant"),
        ("bright", "faint", "distant", "polished", "cold", "silver", "curved", "precise",
         "dark", "clear"),
        ("aligned", "cleaned", "recorded", "measured", "adjusted", "calibrated", "charted",
         "observed"),
        ("astronomer", "lens grinder", "instrument maker", "night watcher", "chart maker",
         "clock keeper"),
        ("eclipse watch", "star count", "comet night", "lens exhibition"),
        ("clean the mirrors", "chart the northern stars", "wind the clocks",
         "record the comet", "align the telescope", "grind a new lens"),
        ("The sky was clear and full of stars.", "A thin moon rose over the dome.",
         "Frost formed on the railing of the rooftop.", "The dome creaked as it turned.",
         "Far below, the lights of the town went out one by one.",
         "A meteor crossed the eastern sky.")),
    _Topic(
        "kitchen", "a town of bakeries and long tables",
        ("kitchen", "bakery", "pantry", "cellar", "dining hall"),
        ("loaf", "pot", "ladle", "bowl", "jar", "spoon", "kettle", "pan", "knife", "plate",
         "oven tray", "cake"),
        ("warm", "fresh", "sweet", "spiced", "crisp", "steaming", "sour", "golden", "salted",
         "soft"),
        ("baked", "stirred", "tasted", "chopped", "washed", "seasoned", "boiled", "served"),
        ("baker", "cook", "pastry maker", "cheesemaker", "brewer", "kitchen hand"),
        ("bread festival", "cooking contest", "wedding feast", "tasting evening"),
        ("knead the dough", "wash the pots", "fill the spice jars", "polish the spoons",
         "bake the rye bread", "scrub the ovens"),
        ("The smell of fresh bread filled the kitchen.", "Steam rose from every pot.",
         "Flour covered the long table.", "The oven crackled in the corner.",
         "Someone laughed in the dining hall.", "A kettle whistled on the stove.")),
    _Topic(
        "forest", "a town at the edge of a deep forest",
        ("clearing", "hunting lodge", "river bank", "woodpile", "ranger hut"),
        ("axe", "log", "trail", "branch", "mushroom", "pinecone", "rope", "lantern", "tent",
         "trap", "basket", "map"),
        ("tall", "mossy", "damp", "shadowed", "green", "fallen", "thick", "wild", "quiet",
         "ancient"),
        ("chopped", "gathered", "stacked", "followed", "marked", "cleared", "carried",
         "collected"),
        ("woodcutter", "ranger", "herbalist", "hunter", "trapper", "charcoal burner"),
        ("tree planting", "mushroom hunt", "ranger council", "river crossing"),
        ("clear the trail", "stack the firewood", "mark the old oaks", "gather mushrooms",
         "repair the bridge", "check the traps"),
        ("The forest was quiet after the rain.", "Light fell in long beams between the pines.",
         "An owl called from the dark trees.", "Moss covered every stone by the river bank.",
         "The wind moved the tops of the tall trees.", "A deer crossed the clearing.")),
    _Topic(
        "market", "a town of stalls and traders",
        ("market square", "stall", "warehouse", "counting house", "inn"),
        ("coin", "scale", "bale", "jar", "basket", "ribbon", "carpet", "lamp", "cup", "sack",
         "ledger", "bottle"),
        ("cheap", "costly", "bright", "woven", "painted", "foreign", "heavy", "fine", "cracked",
         "new"),
        ("sold", "weighed", "bought", "counted", "traded", "wrapped", "priced", "displayed"),
        ("merchant", "trader", "weaver", "potter", "innkeeper", "money changer"),
        ("spring market", "spice auction", "carpet fair", "trade council"),
        ("count the coins", "weigh the spices", "fold the carpets", "price the lamps",
         "sweep the stall", "write the ledger"),
        ("Voices rose and fell across the market square.", "The stalls were crowded by noon.",
         "A cart rattled over the cobblestones.", "Spices coloured the air near the warehouse.",
         "Bells rang from the tower of the counting house.",
         "Traders shouted their prices to the crowd.")),
)

# --------------------------------------------------------------------------------------------
# Small helpers (only Random.random() is drawn from)
# --------------------------------------------------------------------------------------------


def _int(rng, low, high):
    """Uniform int in low..high (both inclusive)."""
    return low + int(rng.random() * (high - low + 1))


def _pick(rng, seq):
    return seq[int(rng.random() * len(seq))]


def _sample(rng, seq, k):
    """k distinct elements of seq (k <= len(seq)), in draw order."""
    pool = list(seq)
    out = []
    for _ in range(k):
        out.append(pool.pop(int(rng.random() * len(pool))))
    return out


def _number(n):
    """0..99 in words."""
    if n < 20:
        return _NUMBERS[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else "-" + _NUMBERS[ones])


def _count(n, noun):
    """'one crate', 'two crates', 'no crates'."""
    if n == 0:
        return f"no {_plural(noun)}"
    return f"{_number(n)} {noun if n == 1 else _plural(noun)}"


def _times(n):
    return {1: "once", 2: "twice"}.get(n, f"{_number(n)} times")


def _join(items):
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(noun):
    head, _, last = noun.rpartition(" ")
    if last.endswith(("s", "x", "ch", "sh")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        last = last[:-1] + "ies"
    elif last == "loaf":
        last = "loaves"
    elif last == "knife":
        last = "knives"
    elif last == "shelf":
        last = "shelves"
    else:
        last += "s"
    return f"{head} {last}" if head else last


def _article(word):
    return "an" if word[0] in "aeiou" else "a"


def _cap(sentence):
    return sentence[0].upper() + sentence[1:]


def _syllables(rng, count):
    """`count` onset-vowel syllables, a coda after the last."""
    return "".join(_pick(rng, _ONSETS) + _pick(rng, _VOWELS) for _ in range(count)) + _pick(
        rng, _CODAS)


def _name(rng, used, ending=()):
    """A made-up capitalised name (2 syllables, or 1-2 and an ending), not in `used` (then
    added to it)."""
    while True:
        name = _syllables(rng, _int(rng, 1, 2) if ending else 2)
        if ending:
            name += _pick(rng, ending)
        name = name.capitalize()
        if name not in used and len(name) >= 3:
            used.add(name)
            return name


# --------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Person:
    """One person of a document's cast (all strings are as they appear in the text)."""
    first: str
    family: str
    he: str  # "he" / "she"
    his: str  # "his" / "her"
    profession: str
    home: str
    age: int
    colour: str
    item: str
    animal: str
    pet: str


@dataclasses.dataclass
class Document:
    """A generated document and the facts it was built from.

    Attributes:
      text: the document, one line (no newline).
      topic: the topic name (e.g. "harbor").
      town: the made-up town name.
      people: the cast in order of introduction (list of `Person`).
      facts: {description: value}, e.g. {"the code of the rusty anchor": "4719"}.
      shelves: [(noun, initial count)] of the inventory, in shelf order.
      visits: {(first name, place): number of visits in the body}.
      body_start, closing_start: character offsets in `text` where the body and the closing
        begin (`text[:body_start]` is the opening, cast, facts, inventory and task list).
    """
    text: str
    topic: str
    town: str
    people: list
    facts: dict
    shelves: list
    visits: dict
    body_start: int
    closing_start: int


def _document_rng(index, seed):
    return random.Random(f"lion_jax.mlm_corpus/v{GENERATOR_VERSION}/{seed}/{index}")


def generate_document(index, *, seed=0, min_chars=1000, max_chars=3000):
    """Document `index` of the corpus of `seed` (module docstring), with its facts.

    Args:
      index: non-negative int; documents of different indices are independent.
      seed: non-negative int; the corpus of each seed is different.
      min_chars, max_chars: range of the target length in characters (module docstring).

    Returns:
      A `Document` (`.text` is the text: one line, no newline).
    """
    _check(index=index, seed=seed, min_chars=min_chars, max_chars=max_chars)
    rng = _document_rng(index, seed)
    target = _int(rng, min_chars, max_chars)
    topic = _pick(rng, _TOPICS)
    used = set()
    town = _name(rng, used, _TOWN_ENDINGS)

    # Cast.
    num_people = max(2, min(5, target // 600))
    professions = _sample(rng, topic.professions, num_people)
    people = []
    for profession in professions:
        she = rng.random() < 0.5
        people.append(Person(
            first=_name(rng, used), family=_name(rng, used, _FAMILY_ENDINGS),
            he="she" if she else "he", his="her" if she else "his", profession=profession,
            home=_name(rng, used, _TOWN_ENDINGS), age=_int(rng, 19, 78),
            colour=_pick(rng, _COLOURS), item=_pick(rng, topic.nouns),
            animal=_pick(rng, _ANIMALS), pet=_name(rng, used)))

    opening = [f"This is a story from {town}, {topic.description}."]
    for p in people:
        opening.append(
            f"{p.first} {p.family} is {_article(p.profession)} {p.profession} from {p.home}. "
            f"{_cap(p.he)} is {p.age} years old, keeps {_article(p.colour)} {p.colour} "
            f"{p.item} and has {_article(p.animal)} {p.animal} called {p.pet}.")

    # Facts.
    facts = {}
    code_noun = f"{_pick(rng, topic.adjectives)} {_pick(rng, topic.nouns)}"
    facts[f"the code of the {code_noun}"] = f"{_int(rng, 1000, 9999)}"
    event = _pick(rng, topic.events)
    facts[f"the {event}"] = _pick(rng, _WEEKDAYS)
    door_place = _pick(rng, topic.places)
    facts[f"the door of the {door_place}"] = _pick(rng, _COLOURS)
    fact_sentences = [
        f"The code of the {code_noun} is {facts[f'the code of the {code_noun}']}.",
        f"The {event} takes place every {facts[f'the {event}']}.",
        f"The door of the {door_place} is painted {facts[f'the door of the {door_place}']}."]
    if target < 1500:
        fact_sentences.pop()
        del facts[f"the door of the {door_place}"]
    opening += fact_sentences

    # Inventory: shelves with counts (nested list + arithmetic).
    store = _pick(rng, topic.places)
    shelf_nouns = _sample(rng, topic.nouns, _int(rng, 2, 4))
    shelves = [[noun, _int(rng, 2, 9)] for noun in shelf_nouns]
    parts = [f"on the {_ORDINALS[i]} shelf {_count(n, noun)}"
             for i, (noun, n) in enumerate(shelves)]
    opening.append(
        f"In the {store} there are {_number(len(shelves))} shelves: {_join(parts)}. "
        f"Altogether the shelves hold "
        f"{_number(sum(n for _, n in shelves))} things.")
    initial_shelves = [(noun, n) for noun, n in shelves]

    # Task list (second task has two sub-items).
    tasks = _sample(rng, topic.tasks, 5)
    owner = _pick(rng, people)
    opening.append(
        f"{owner.first} wrote a list of tasks: first, {tasks[0]}; second, {tasks[1]}, which "
        f"has two parts: {tasks[3]} and {tasks[4]}; third, {tasks[2]}.")

    # Body.
    visits = {}
    taken = set()
    body = []

    def closing_text():
        out = ["In the end, this is what we know."]
        for p in people:
            s = (f"{p.first} {p.family}, the {p.profession} from {p.home}, is {p.age} and "
                 f"has {_article(p.animal)} {p.animal} called {p.pet}.")
            places = [(place, n) for (first, place), n in visits.items() if first == p.first]
            if places:
                s += f" {_cap(p.he)} visited " + _join(
                    [f"the {place} {_times(n)}" for place, n in places]) + "."
            out.append(s)
        for key, value in facts.items():
            verb = "is" if key.startswith("the code") else (
                "is painted" if key.startswith("the door") else "takes place every")
            out.append(f"{_cap(key)} {verb} {value}.")
        return " ".join(out)

    def sentence():
        kind = int(rng.random() * 12)
        p = _pick(rng, people)
        if kind in (0, 1):  # visit, with an ordinal counting earlier visits
            place = _pick(rng, topic.places)
            n = visits.get((p.first, place), 0) + 1
            visits[(p.first, place)] = n
            ordinal = _ORDINALS[n - 1] if n <= len(_ORDINALS) else "next"
            return (f"In the {_pick(rng, _TIMES)}, {p.first} went to the {place}. It was "
                    f"{p.his} {ordinal} visit to the {place}.")
        if kind == 2:  # meeting, restating the other person's attributes
            q = _pick(rng, [x for x in people if x is not p])
            return (f"At the {_pick(rng, topic.places)}, {p.first} met {q.first} {q.family}, "
                    f"the {q.profession} from {q.home}.")
        if kind == 3:  # pet
            return _pick(rng, (
                f"{p.first} took {p.his} {p.animal} {p.pet} along.",
                f"{p.pet}, the {p.animal} of {p.first}, slept next to the "
                f"{_pick(rng, topic.nouns)}.",
                f"{p.first} fed {p.pet} before going to the {_pick(rng, topic.places)}."))
        if kind == 4:  # kept object, home town
            return _pick(rng, (
                f"{p.first} still kept the {p.colour} {p.item} from {p.home}.",
                f"{p.first} thought about {p.his} home in {p.home}.",
                f"{p.first} missed {p.home}; {p.he} had not been there for a long time."))
        if kind == 5:  # age
            return (f"{p.first}, who is {p.age} years old, {_pick(rng, topic.actions)} the "
                    f"{_pick(rng, topic.adjectives)} {_pick(rng, topic.nouns)}.")
        if kind == 6:  # a fact, asked and answered
            q = _pick(rng, [x for x in people if x is not p])
            key = _pick(rng, list(facts))
            if key.startswith("the code"):
                return (f"{q.first} asked about {key}, and {p.first} said that it was "
                        f"{facts[key]}.")
            if key.startswith("the door"):
                return f"{p.first} remembered that {key} was painted {facts[key]}."
            return f"{p.first} told {q.first} that {key} would be on {facts[key]}."
        if kind == 7:  # take things from a shelf; the count left depends on every removal
            i = int(rng.random() * len(shelves))
            noun, n = shelves[i]
            if n == 0:
                return f"The {_ORDINALS[i]} shelf was empty, so {p.first} left without any."
            k = _int(rng, 1, min(3, n))
            shelves[i][1] = n - k
            left = n - k
            return (f"{p.first} took {_count(k, noun)} from the {_ORDINALS[i]} shelf, so "
                    f"{_count(left, noun)} {'was' if left == 1 else 'were'} left there.")
        if kind == 8:  # task list by position
            j = int(rng.random() * 3)
            if j in taken:
                return f"The {_ORDINALS[j]} task on the list, to {tasks[j]}, was already done."
            taken.add(j)
            return f"{p.first} did the {_ORDINALS[j]} task on the list: {p.he} had to {tasks[j]}."
        if kind == 9:  # work on topic objects, pronoun
            noun = _pick(rng, topic.nouns)
            return (f"{p.first} {_pick(rng, topic.actions)} {_article(noun)} {noun}, and then "
                    f"{p.he} {_pick(rng, topic.actions)} the {_pick(rng, topic.nouns)}.")
        return _pick(rng, topic.ambient)  # 10, 11: the topic's ambient sentences

    head = " ".join(opening)
    closing = closing_text()
    while len(head) + sum(len(s) + 1 for s in body) + len(closing) + 1 < target:
        body.append(" ".join(sentence() for _ in range(_int(rng, 3, 6))))
        closing = closing_text()
    text = " ".join([head, *body, closing])
    return Document(text=text, topic=topic.name, town=town, people=people, facts=facts,
                    shelves=initial_shelves, visits=visits, body_start=len(head) + 1,
                    closing_start=len(text) - len(closing))


def _check(**kwargs):
    for name, value in kwargs.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if "min_chars" in kwargs and kwargs["min_chars"] > kwargs["max_chars"]:
        raise ValueError(f"min_chars ({kwargs['min_chars']}) must be <= max_chars "
                         f"({kwargs['max_chars']})")


def iter_documents(num_documents, *, seed=0, start=0, min_chars=1000, max_chars=3000):
    """Yields the texts of documents `start, ..., start + num_documents - 1` of `seed`.

    Returns:
      An iterator of str (one document each, no newline), equal to
      `generate_document(i, seed=seed, ...).text` for each index i.
    """
    _check(num_documents=num_documents, start=start)
    for index in range(start, start + num_documents):
        yield generate_document(index, seed=seed, min_chars=min_chars, max_chars=max_chars).text


def write_corpus(path, num_documents, *, seed=0, start=0, min_chars=1000, max_chars=3000):
    """Writes documents `start .. start + num_documents - 1` of `seed` to the text file `path`,
    one document per line (UTF-8, "\\n" after each), atomically (a temporary file renamed).

    Returns:
      `path`.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".corpus_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for text in iter_documents(num_documents, seed=seed, start=start,
                                       min_chars=min_chars, max_chars=max_chars):
                f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write the embedded MLM corpus, one document "
                                                 "per line.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--num_documents", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--min_chars", type=int, default=1000)
    parser.add_argument("--max_chars", type=int, default=3000)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    write_corpus(args.out, args.num_documents, seed=args.seed, start=args.start,
                 min_chars=args.min_chars, max_chars=args.max_chars)
    print(f"Wrote {args.num_documents} documents to {args.out} in "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
