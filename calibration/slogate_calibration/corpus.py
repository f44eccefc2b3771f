"""A varied text sample: for tokens-per-character, and as raw material for prompts.

Varied on purpose: prose, code, JSON, numbers, several languages and chat-style text
tokenize at very different rates, and a gate estimating n_in from characters must
know the spread, not only the mean.
"""

SAMPLES: tuple[str, ...] = (
    # English prose
    "The harbour was quiet in the early morning. Fishing boats rocked against the pier, "
    "their ropes creaking, while gulls argued over scraps near the market stalls. An old "
    "man sat on an upturned crate, mending a net with hands that had done the same work "
    "for sixty years, and he hummed a song nobody else remembered.",
    # Technical prose
    "Admission control decides, for every arriving request, whether serving it would keep "
    "the latency objective. Little's law relates the mean number of requests in a system to "
    "the arrival rate and the mean time each spends inside; run backwards, it bounds how "
    "many requests may be admitted while the objective still holds.",
    # Python code
    "def fibonacci(n: int) -> list[int]:\n    seq = [0, 1]\n    while len(seq) < n:\n"
    "        seq.append(seq[-1] + seq[-2])\n    return seq[:n]\n\n\nclass Cache:\n"
    "    def __init__(self, size=128):\n        self._data = {}\n        self.size = size\n",
    # JSON
    '{"id": "req-8812", "model": "smollm2", "messages": [{"role": "user", "content": '
    '"Summarise the report"}], "max_tokens": 256, "temperature": 0.2, "stream": true, '
    '"metadata": {"tenant": "acme", "priority": 3, "tags": ["batch", "eu-west-1"]}}',
    # Numbers and tables
    "2024-03-01,17.25,1893,0.0042\n2024-03-02,17.31,2011,0.0039\n2024-03-03,16.98,1755,"
    "0.0051\n2024-03-04,17.40,2204,0.0036\nTotal: 7,863 units; mean price 17.235; p95 "
    "latency 412 ms; 99.95% availability over 2,629,746 seconds.",
    # Chat turn
    "User: hey, can you help me write an email to my landlord? the heating has been broken "
    "since tuesday and it's freezing.\nAssistant: Of course. Here's a short, polite draft "
    "you can adapt: Dear Ms. Patel, I'm writing to let you know the heating stopped working",
    # German
    "Die Zugverbindung zwischen den beiden Städten wurde wegen Bauarbeiten vorübergehend "
    "eingestellt. Reisende werden gebeten, auf die Ersatzbusse auszuweichen, die stündlich "
    "vom Bahnhofsvorplatz abfahren. Wir bitten um Verständnis für die Unannehmlichkeiten.",
    # French
    "Le comité a approuvé le nouveau budget après une longue discussion sur les priorités "
    "de l'année prochaine. Les crédits destinés à la recherche augmenteront légèrement, "
    "tandis que les dépenses de fonctionnement resteront stables jusqu'en décembre.",
    # Spanish
    "La biblioteca municipal amplía su horario durante el periodo de exámenes. Los "
    "estudiantes podrán reservar salas de estudio en línea y utilizar los ordenadores "
    "hasta la medianoche, siempre que presenten su carné universitario en la entrada.",
    # Shell and logs
    "$ kubectl -n inference get pods -l app=llama\nNAME                     READY   STATUS\n"
    "llama-7f9c6d5b8-x2kqp    2/2     Running\n2026-12-02T10:14:07Z WARN upstream=127.0.0.1:8080 "
    "queue_tokens=1844 budget=1600 decision=reject retry_after=2s class=batch",
    # Markdown
    "## Installation\n\n1. Clone the repository.\n2. Run `make test`.\n3. Edit `values.yaml`"
    " and set `slo.ttftSeconds`.\n\n> **Note:** the first build compiles llama.cpp and takes "
    "a few minutes.\n\n| flag | meaning |\n|---|---|\n| `-t` | threads |",
    # Chinese
    "今天的天气非常好，我们一起去公园散步吧。公园里有很多人在跑步、打太极拳和放风筝。"
    "孩子们在草地上玩耍，老人们坐在长椅上聊天，一切都显得那么安静而美好。",
    # Mathematics
    "Let f(x) = x^3 - 6x^2 + 11x - 6. Then f(1) = 0, f(2) = 0 and f(3) = 0, so "
    "f(x) = (x - 1)(x - 2)(x - 3). The derivative f'(x) = 3x^2 - 12x + 11 vanishes at "
    "x = 2 ± 1/sqrt(3), where f has its local extrema.",
    # URLs and identifiers
    "See https://example.com/docs/v2/reference#admission-policy and "
    "ghcr.io/acme/llama-server:b4521-avx2 "
    "(sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08)"
    " for the image; ticket OPS-11827 tracks the rollout to cluster eu-central-prod-3.",
)
