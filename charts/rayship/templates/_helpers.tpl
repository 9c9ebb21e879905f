{{- define "rayship.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The release's full name: every object is named after it, the cluster-wide ones included, so that
several releases install side by side. */ -}}
{{- define "rayship.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "rayship.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The release's ClusterRole of the Ray pods and its admission policy (rayship.api.names.workload_role
and workload_policy); the operator is told the ClusterRole (RAYSHIP_WORKLOAD_ROLE). */ -}}
{{- define "rayship.workloadRole" -}}
{{- printf "%s-workload" (include "rayship.fullname" .) -}}
{{- end -}}

{{- define "rayship.workloadPolicy" -}}
{{- printf "%s-workload-writes-its-own-status" (include "rayship.fullname" .) -}}
{{- end -}}

{{- define "rayship.labels" -}}
app.kubernetes.io/name: {{ include "rayship.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rayship
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "rayship.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rayship.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "rayship.serviceAccountName" -}}
{{- default (include "rayship.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- /* The operator image: [registry/]repository:tag. */ -}}
{{- define "rayship.image" -}}
{{- $registry := trimSuffix "/" .Values.image.registry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}{{- $repository = printf "%s/%s" $registry $repository -}}{{- end -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- /* A map's keys set to null left out (helm keeps `--set key=null` where the defaults lack the key),
e.g. podSecurityContext.runAsUser=null: no `runAsUser: null` in the manifest. */ -}}
{{- define "rayship.withoutNulls" -}}
{{- $out := dict -}}
{{- range $key, $value := . -}}
{{- if not (kindIs "invalid" $value) -}}{{- $_ := set $out $key $value -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{- toYaml $out -}}{{- end -}}
{{- end -}}
