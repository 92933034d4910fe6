"""Checkpoints from http(s) URLs, served by a local HTTP server on 127.0.0.1 (no outside network).

Downloaded once into the torch hub cache (``TORCH_HOME`` points into tmp_path), atomically, and loaded through the
same weights-only path as local files: ``init_cfg``, mmengine's ``load_checkpoint`` / ``CheckpointLoader``
(``load_from``, ``--resume``) and its ``load_url`` (``torchvision://``, ``open-mmlab://``).
"""
from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import randomize_
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint, load_checkpoint
from torch import nn

from mmplugin.checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    UnsafeCheckpointError,
    download_checkpoint,
    load_checkpoint_file,
)


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class _Evil:

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


@pytest.fixture
def server(tmp_path, monkeypatch):
    """Serve ``files`` (path -> bytes, or (bytes, announced length, content type)); count requests per path."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    files: dict[str, object] = {}
    hits: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):

        def do_GET(self):  # noqa: N802
            hits[self.path] = hits.get(self.path, 0) + 1
            if self.path.startswith('/slow'):
                time.sleep(0.5)  # long enough for concurrent requests to overlap
            entry = files.get(self.path)
            if entry is None:
                self.send_error(404)
                return
            body, length, ctype = entry if isinstance(entry, tuple) else (entry, None, 'application/octet-stream')
            self.send_response(200)
            self.send_header('Content-Type', ctype)
            self.send_header('Content-Length', str(length if length is not None else len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f'http://127.0.0.1:{httpd.server_address[1]}'
    yield base, files, hits
    httpd.shutdown()
    httpd.server_close()


def _cache(tmp_path):
    folder = tmp_path / 'torch_home' / 'hub' / 'checkpoints'
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith('.lock')) if folder.exists() else []


def test_download_once_then_load_weights_only(server, tmp_path, capsys):
    base, files, hits = server
    sd = {'w': torch.randn(300, 7)}
    files['/ckpt/model.pth'] = _saved({'state_dict': sd})
    url = base + '/ckpt/model.pth'
    ckpt = load_checkpoint_file(url)
    assert torch.equal(ckpt['state_dict']['w'], sd['w'])
    assert _cache(tmp_path) == ['model.pth']
    assert load_checkpoint_file(url)['state_dict']['w'].shape == (300, 7)
    assert hits['/ckpt/model.pth'] == 1, 'downloaded twice'
    # mmengine's URL paths go through the same loader (load_from, --resume, init_cfg=Pretrained of other models)
    assert torch.equal(_load_checkpoint(url)['state_dict']['w'], sd['w'])
    assert torch.equal(CheckpointLoader.load_checkpoint(url)['state_dict']['w'], sd['w'])
    import mmengine.runner.checkpoint as mm_ckpt
    assert torch.equal(mm_ckpt.load_url(url)['state_dict']['w'], sd['w'])  # torchvision:// / open-mmlab://
    assert hits['/ckpt/model.pth'] == 1
    # progress bar on request
    files['/big.pth'] = _saved({'x': torch.zeros(1000)})
    download_checkpoint(base + '/big.pth', progress=True)
    assert 'big.pth' in capsys.readouterr().err


def test_url_in_init_cfg_and_mmengine_load_checkpoint(server, tmp_path):
    from mmplugin.models import SwiftFormer
    base, files, _ = server
    src = randomize_(SwiftFormer('xs'), seed=3)
    files['/sf.pth'] = _saved({'state_dict': src.state_dict()})
    model = SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=base + '/sf.pth'))
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    lin = nn.Linear(3, 2)
    files['/lin.pth'] = _saved({'state_dict': nn.Linear(3, 2).state_dict()})
    load_checkpoint(lin, base + '/lin.pth', strict=True)
    assert torch.equal(lin.weight, load_checkpoint_file(base + '/lin.pth')['state_dict']['weight'])


def test_remote_pickle_cannot_run_code(server, tmp_path):
    base, files, _ = server
    marker = tmp_path / 'pwned'
    files['/evil.pth'] = _saved({'w': torch.zeros(1), 'x': _Evil(marker)})
    for load in (lambda: load_checkpoint_file(base + '/evil.pth'), lambda: _load_checkpoint(base + '/evil.pth')):
        with pytest.raises(UnsafeCheckpointError, match='Nothing in the file was executed'):
            load()
    assert not marker.exists()


def test_404_is_not_found(server, tmp_path):
    base, _, _ = server
    with pytest.raises(CheckpointNotFoundError, match='HTTP 404') as info:
        load_checkpoint_file(base + '/nope.pth')
    assert isinstance(info.value, FileNotFoundError)
    from mmplugin.models import SwiftFormer
    with pytest.raises(CheckpointError, match='not found'):
        SwiftFormer('xs', init_cfg=dict(type='Pretrained', checkpoint=base + '/nope.pth')).init_weights()
    assert _cache(tmp_path) == []


def test_truncated_download_leaves_nothing(server, tmp_path):
    base, files, _ = server
    body = _saved({'w': torch.randn(5000)})
    files['/cut.pth'] = (body[:len(body) // 2], len(body), 'application/octet-stream')  # server closes early
    with pytest.raises(CheckpointError, match='truncated|interrupted') as info:
        load_checkpoint_file(base + '/cut.pth')
    assert 'weights_only' not in str(info.value)
    assert _cache(tmp_path) == []
    files['/cut.pth'] = body  # the next attempt downloads again and succeeds
    assert load_checkpoint_file(base + '/cut.pth')['w'].shape == (5000, )


def test_html_instead_of_checkpoint(server, tmp_path):
    base, files, _ = server
    page = (b'<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body>Google Drive '
            b"can't scan this file for viruses.</body></html>")
    files['/uc?export=download&id=abc'] = (page, None, 'text/html')
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(base + '/uc?export=download&id=abc')
    msg = str(info.value)
    assert 'HTML page' in msg and 'Google Drive' in msg and 'weights_only' not in msg, msg
    assert _cache(tmp_path) == []


def test_hash_suffix_is_checked(server, tmp_path):
    base, files, _ = server
    body = _saved({'w': torch.ones(3)})
    digest = hashlib.sha256(body).hexdigest()
    good_name = f'/w-{digest[:8]}.pth'
    files[good_name] = body
    assert load_checkpoint_file(base + good_name)['w'].sum() == 3
    wrong = 'abcdef12' if not digest.startswith('abcdef12') else 'abcdef13'
    files[f'/w-{wrong}.pth'] = body
    with pytest.raises(CheckpointError, match=f'sha256 starts with {digest[:8]}, expected {wrong}'):
        load_checkpoint_file(base + f'/w-{wrong}.pth')
    files['/model_20220317-12345678.pth'] = body  # digits only: a date, not a hash, so not checked
    assert load_checkpoint_file(base + '/model_20220317-12345678.pth')['w'].sum() == 3
    assert _cache(tmp_path) == sorted([good_name[1:], 'model_20220317-12345678.pth'])


def test_query_urls_do_not_share_a_cache_file(server, tmp_path):
    base, files, _ = server
    files['/uc?id=1'] = _saved({'w': torch.tensor([1.])})
    files['/uc?id=2'] = _saved({'w': torch.tensor([2.])})
    assert load_checkpoint_file(base + '/uc?id=1')['w'].item() == 1
    assert load_checkpoint_file(base + '/uc?id=2')['w'].item() == 2
    assert len(_cache(tmp_path)) == 2


def test_resume_from_url_is_checked_before_training(server, tmp_path):
    from argparse import Namespace

    from mmengine.config import Config

    from mmplugin.cli.runner import prepare_runner_cfg
    base, files, _ = server
    files['/iter_4.pth'] = _saved({'meta': {'iter': 4}, 'state_dict': {}})
    cfg = Config(dict(work_dir=str(tmp_path / 'w')))
    prepare_runner_cfg(cfg, Namespace(config='x.py', resume=base + '/iter_4.pth', work_dir=str(tmp_path / 'w')))
    assert cfg.resume and cfg.load_from == base + '/iter_4.pth'
    with pytest.raises(CheckpointNotFoundError):
        prepare_runner_cfg(cfg, Namespace(config='x.py', resume=base + '/gone.pth', work_dir=str(tmp_path / 'w')))


def test_concurrent_processes_download_once(server, tmp_path):
    """DDP ranks asking for the same URL at once: one download (file lock), the others reuse the cached file."""
    base, files, hits = server
    files['/slow/w.pth'] = _saved({'w': torch.arange(10.)})
    results = []
    threads = [threading.Thread(target=lambda: results.append(download_checkpoint(base + '/slow/w.pth')))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and hits['/slow/w.pth'] == 1
    assert load_checkpoint_file(results[0])['w'][-1] == 9


def test_weights_folder_is_used_by_name_before_any_download(server, tmp_path, monkeypatch):
    """A file put in $MMPLUGIN_WEIGHTS by hand is used for its URL without a request, checked against the sha256
    its name carries (or the one given); a file that differs is refused naming it."""
    base, files, hits = server
    body = _saved({'w': torch.full((4, ), 7.0)})
    digest = hashlib.sha256(body).hexdigest()
    own = tmp_path / 'weights'
    own.mkdir()
    monkeypatch.setenv('MMPLUGIN_WEIGHTS', f'{tmp_path / "empty"}{os.pathsep}{own}')
    (own / f'model-{digest[:8]}.pth').write_bytes(body)
    url = base + f'/elsewhere/model-{digest[:8]}.pth'  # nothing served there: only the folder can answer
    assert load_checkpoint_file(url)['w'].sum() == 28
    assert not hits and _cache(tmp_path) == []
    (own / 'plain.pth').write_bytes(body)
    assert download_checkpoint(base + '/plain.pth', sha256=digest) == str(own / 'plain.pth')
    with pytest.raises(CheckpointError, match=f'plain.pth .*is not the published file.*expected {"0" * 64}'):
        download_checkpoint(base + '/plain.pth', sha256='0' * 64)
    files['/full.pth'] = body  # downloaded, the full sha256 is checked the same way
    with pytest.raises(CheckpointError, match='is corrupt: its sha256 starts with'):
        download_checkpoint(base + '/full.pth', sha256='f' * 64)
    assert download_checkpoint(base + '/full.pth', sha256=digest).endswith('full.pth') and hits['/full.pth'] == 2


@pytest.fixture
def https_server(tmp_path, monkeypatch):
    """An HTTPS server on 127.0.0.1 with a freshly made self-signed certificate (openssl), serving one file."""
    import shutil
    import ssl
    import subprocess
    if shutil.which('openssl') is None:
        pytest.skip('needs the openssl command to make a certificate')
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.delenv('MMPLUGIN_WEIGHTS', raising=False)
    key, cert = tmp_path / 'key.pem', tmp_path / 'cert.pem'
    subprocess.run(['openssl', 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', str(key), '-out',
                    str(cert), '-days', '1', '-subj', '/CN=127.0.0.1'], check=True, capture_output=True, timeout=60)
    body = _saved({'w': torch.ones(2)})

    class Handler(BaseHTTPRequestHandler):

        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f'https://127.0.0.1:{httpd.server_address[1]}', body
    httpd.shutdown()
    httpd.server_close()


def test_tls_failure_is_one_line_naming_url_file_and_folder(https_server, tmp_path):
    """A certificate that cannot be verified (self-signed) stops the download with one line: the URL, what failed,
    the file name and where to put it; verification is not switched off (nothing is downloaded or cached)."""
    base, body = https_server
    url = base + '/ckpts/swin_tiny_patch4_window7_224.pth'
    with pytest.raises(CheckpointError) as info:
        load_checkpoint_file(url)
    msg = str(info.value)
    assert '\n' not in msg and url in msg and 'certificate' in msg and 'verification stays on' in msg
    assert 'swin_tiny_patch4_window7_224.pth' in msg and str(tmp_path / 'torch_home' / 'hub' / 'checkpoints') in msg
    assert 'MMPLUGIN_WEIGHTS' in msg and _cache(tmp_path) == []


def test_refused_connection_names_the_folder(tmp_path, monkeypatch):
    import socket
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setenv('MMPLUGIN_WEIGHTS', str(tmp_path / 'mine'))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    with pytest.raises(CheckpointError, match=rf'connection was refused; fetch x\.pth .* put it in {tmp_path}/mine'):
        download_checkpoint(f'http://127.0.0.1:{port}/x.pth')
