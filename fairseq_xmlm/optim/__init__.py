from fairseq_xmlm._autoimport import import_all_modules

import_all_modules(__name__, __path__)
