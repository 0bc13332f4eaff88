"""heart.embeddings.MiniLM computes sentence-transformers' vectors for the embedded MiniLM, so the
embedding cache (and every retrieval figure) is the same whichever computed it."""

import numpy as np
import pytest

from heart.embeddings import minilm_path


@pytest.fixture(scope="module")
def texts():
    return [
        "How much fuel do I have right now?",
        "Lock the doors",
        "Please create a new file named 'hawaii-packing-list.docx' containing the packing list for the "
        "vacation plans in Hawaii based on the other document. Then, share the document with "
        "john.doe@gmail.com with read permissions",
        "displayCarStatus: Displays the status of the vehicle based on the provided display option. " * 30,
        "",
    ]


def test_vectors_match_sentence_transformers(texts):
    from sentence_transformers import SentenceTransformer

    from heart.embeddings import MiniLM

    reference = SentenceTransformer(str(minilm_path()), device="cpu").encode(
        texts, batch_size=2, normalize_embeddings=True, convert_to_numpy=True)
    ours = MiniLM(minilm_path()).encode(texts, batch_size=2)
    assert ours.shape == reference.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=2e-6)


def test_batches_do_not_change_a_text_s_vector(texts):
    from heart.embeddings import MiniLM

    model = MiniLM(minilm_path())
    alone = np.stack([model.encode([t])[0] for t in texts])
    np.testing.assert_allclose(model.encode(texts, batch_size=64), alone, atol=2e-6)
    assert model.max_seq_length == 256  # from the folder's sentence_bert_config.json
